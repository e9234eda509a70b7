"""The evaluation split over ranks: every rank makes as many generate calls (a ZeRO-3 collective each) as the rank
with the most problems, and keeps only its own problems' records."""

from __future__ import annotations

import pytest

from tokenpo.data import Example
from tokenpo.deepspeed import dist
from tokenpo.evaluation import run
from tokenpo.evaluation.config import EvalConfig
from tokenpo.rollout.engine import Responses


class WrongScorer:
    def submit(self, texts, golds):
        return ["wrong"] * len(texts)

    def result(self, verdicts):
        return verdicts


@pytest.mark.parametrize("problems, batch_size, n, calls", [
    # ranks hold problems 0, 2 and 1: rank 1's second call repeats its own first problem
    (3, 1, 0, {0: [[0], [2]], 1: [[1], [1]]}),
    # rank 1 holds none: it still joins rank 0's call, with rank 0's first problem
    (1, 4, 0, {0: [[0]], 1: [[0]]}),
    # 2 samples each: 2 problems per call
    (9, 4, 2, {0: [[0, 2], [4, 6], [8]], 1: [[1, 3], [5, 7], [1]]}),
    (0, 4, 0, {0: [], 1: []}),
])
def test_every_rank_makes_the_calls_of_the_rank_with_the_most_problems(monkeypatch, problems, batch_size, n, calls):
    examples = [Example(uid=str(i), problem=f"{i} + 1?", answer=str(i + 1)) for i in range(problems)]
    for rank in (0, 1):
        seen = []  # the prompts of each generate call

        def generate(prompt_ids, params, generator):
            seen.append([p[0] for p in prompt_ids])
            rows = len(prompt_ids) * params.num_samples
            return Responses([[7]] * rows, [False] * rows)

        monkeypatch.setattr(dist, "rank", lambda: rank)
        monkeypatch.setattr(dist, "world_size", lambda: 2)
        monkeypatch.setattr(dist, "all_gather_objects", lambda records: [records])
        _, records = run.evaluate(examples, lambda ex: [int(ex.uid)], generate, lambda ids: ["x"] * len(ids),
                                  WrongScorer(), EvalConfig(name="arith", batch_size=batch_size, greedy=not n, n=n),
                                  ("boxed", "none", None), max_new_tokens=4, stop_token_ids=(), seed=0)
        assert seen == calls[rank]
        assert [r["uid"] for r in records] == [str(i) for i in range(rank, problems, 2)]

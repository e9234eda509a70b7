"""The evaluation split over ranks: every rank makes as many generate calls (a ZeRO-3 collective each) as the rank
with the most problems, and keeps only its own problems' records."""

from __future__ import annotations

import pytest

from tokenpo.data import Example
from tokenpo.deepspeed import dist
from tokenpo.evaluation import run
from tokenpo.evaluation.config import EvalConfig
from tokenpo.rewards import AnswerSpec


class WrongScorer:
    def score(self, texts, golds):
        return ["wrong"] * len(texts)


class Seen:
    """A sampler recording the first token of each prompt of each call."""

    def __init__(self):
        self.calls = []

    def sample(self, prompt_ids, params, generator):
        self.calls.append([p[0] for p in prompt_ids])
        return ["x"] * (len(prompt_ids) * params.num_samples)


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
    task = run.EvalTask(EvalConfig(name="arith", batch_size=batch_size, greedy=not n, n=n), examples,
                        [[int(ex.uid)] for ex in examples], AnswerSpec(reasoning_tag=None), max_new_tokens=4,
                        stop_token_ids=())
    for rank in (0, 1):
        seen = Seen()
        monkeypatch.setattr(dist, "rank", lambda: rank)
        monkeypatch.setattr(dist, "world_size", lambda: 2)
        monkeypatch.setattr(dist, "all_gather_objects", lambda records: [records])
        records = run.evaluate(task, seen, WrongScorer(), seed=0).records
        assert seen.calls == calls[rank]
        assert [r["uid"] for r in records] == [str(i) for i in range(rank, problems, 2)]

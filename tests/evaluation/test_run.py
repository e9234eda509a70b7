"""The evaluation split over ranks: every rank makes as many generate calls (a ZeRO-3 collective each) as the rank
with the most problems, and keeps only its own problems' records; the records' layout; which scorer judges."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import pytest

from tokenpo.evaluation.judging import benchmark_reward
from tokenpo.data import DataConfig, Example
from tokenpo.deepspeed import dist
from tokenpo.evaluation import run
from tokenpo.evaluation.benchmark import Benchmark
from tokenpo.evaluation.config import EvalConfig
from tokenpo.rewards import AnswerSpec, RewardConfig
from tokenpo.rollout.config import RolloutConfig
from tokenpo.rollout.engine import Responses


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


class ScriptedScorer:
    """Scores as told; `config` is the reward section it would judge by, `batches` what it was asked."""

    def __init__(self, verdicts, config=None):
        self.verdicts, self.config, self.batches = list(verdicts), config, []

    def score(self, texts, golds):
        self.batches.append(list(golds))
        return [self.verdicts.pop(0) for _ in texts]


class Scripted:
    """A sampler answering each call with the next texts of a list."""

    def __init__(self, texts):
        self.texts = list(texts)

    def sample(self, prompt_ids, params, generator):
        return [self.texts.pop(0) for _ in range(len(prompt_ids) * params.num_samples)]


def test_records_hold_each_response_its_verdict_answer_and_form_in_the_eval_json_layout():
    task = run.EvalTask(EvalConfig(name="arith", greedy=True, n=2, pass_k=(1, 2)),
                        [Example(uid="u7", problem="3 + 4?", answer="7")], [[5]], AnswerSpec(fallback="last_number"),
                        max_new_tokens=4, stop_token_ids=())
    sampler = Scripted([r"so \boxed{7}", "it is 7.0", r"<think>\boxed{7}</think> 8"])
    result = run.evaluate(task, sampler, ScriptedScorer(["correct", "correct", "wrong"]), seed=0)
    assert result.records == [{
        "uid": "u7", "problem": "3 + 4?", "gold": "7",
        "greedy": {"response": r"so \boxed{7}", "verdict": "correct", "answer": "7", "asked_format": True},
        "greedy_correct": True,
        "samples": [{"response": "it is 7.0", "verdict": "correct", "answer": "7.0", "asked_format": False},
                    {"response": r"<think>\boxed{7}</think> 8", "verdict": "wrong", "answer": "8",
                     "asked_format": False}],
        "correct": [True, False],
        "answers": ["7", "8"],
    }]
    assert list(result.records[0]) == ["uid", "problem", "gold", "greedy", "greedy_correct", "samples", "correct",
                                       "answers"]
    assert result.metrics["greedy/accuracy"] == 1.0 and result.metrics["mean@2"] == 0.5
    assert result.metrics["asked_format_frac"] == pytest.approx(1 / 3) and result.metrics["accuracy"] == 1.0


def benchmark(answer_format: str) -> Benchmark:
    data = DataConfig(name="arith", answer_format=answer_format, answer_pattern="boxed", fallback="none")
    return Benchmark(EvalConfig(name="arith", greedy=True), [Example(uid="0", problem="1 + 1?", answer="2")], data)


def test_evaluate_benchmark_uses_the_running_scorer_only_when_it_judges_alike(monkeypatch):
    monkeypatch.setattr(run, "capped_prompt_ids", lambda problem, tokenizer, data: [1])
    started = []  # the configs of scorers started for an evaluation

    def scorer_for(config):
        started.append(config)
        return contextlib.nullcontext(ScriptedScorer(["wrong"]))

    monkeypatch.setattr(run, "RewardScorer", scorer_for)
    sampler = run.TextSampler(lambda prompts, params, generator: Responses([[3]], [False]),
                              SimpleNamespace(batch_decode=lambda ids, skip_special_tokens: [r"\boxed{2}"],
                                              eos_token_id=0))
    reward = RewardConfig(num_workers=1)
    judged_by = benchmark_reward(reward, benchmark("number").data)
    running = ScriptedScorer(["correct"], config=judged_by)
    result = run.evaluate_benchmark(benchmark("number"), reward, RolloutConfig(), sampler, seed=0, scorer=running)
    assert (running.batches, started, result.metrics["accuracy"]) == ([["2"]], [], 1.0)
    # a benchmark that reads answers otherwise gets workers of its own, judging as its data config says
    result = run.evaluate_benchmark(benchmark("expression"), reward, RolloutConfig(), sampler, seed=0, scorer=running)
    assert [config.answer_format for config in started] == ["expression"] and result.metrics["accuracy"] == 0.0

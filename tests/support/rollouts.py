"""Scripted stand-ins for collect_rollouts' inputs: a rollout engine, a scorer whose verdicts follow a script of
group kinds, and the real prompt sampler."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import torch

from tokenpo.algorithms.config import DynamicSamplingConfig
from tokenpo.data import Example, PromptSampler
from tokenpo.rewards import CORRECT, GOLD_INVALID, WRONG, Judged, Question, RewardConfig, resolve
from tokenpo.rollout.engine import Responses, SamplingParams
from tokenpo.rollout.generator import AnsweredNow
from tokenpo.trainer.core.batch import RolloutBatch
from tokenpo.trainer.core.source import Prompts, RolloutSource, Schedule
from tokenpo.trainer.core.step import collect_rollouts
from tokenpo.trainer.core.timings import Timings

G = 2
# a group's verdicts: mixed, all right, all wrong, gold answer that does not parse
VERDICTS = {"M": [CORRECT, WRONG], "R": [CORRECT, CORRECT], "W": [WRONG, WRONG], "I": [GOLD_INVALID, GOLD_INVALID]}
NUM_EXAMPLES = 40


class ScriptedEngine(AnsweredNow):
    """A rollout engine that answers every prompt with G one-token responses and counts its calls (one per round)."""

    def __init__(self) -> None:
        self.calls, self.answers, self.device = 0, {}, torch.device("cpu")
        self.published = SimpleNamespace(version=0)

    def load(self, published) -> None:
        self.published = published

    def sample(self, prompt_ids, params, rng):
        self.calls += 1
        return Responses(token_ids=[[7] for _ in prompt_ids for _ in range(G)],
                         truncated=[False] * (len(prompt_ids) * G))


class ScriptedScorer:
    """The prompt drawn i-th (in the sampler's order) gets the verdicts of script[i]: a group's verdicts are looked
    up by its gold answer."""

    def __init__(self, pattern: dict[str, list[str]]) -> None:
        self.pattern = pattern

    def score(self, text: list[str], golds: list[str]) -> list[str]:
        return [v for start in range(0, len(golds), G) for v in self.pattern[golds[start]]]

    def judge(self, text: list[str], questions: list[Question]) -> Judged:
        verdicts = self.score(text, [q.gold for q in questions])
        return Judged(verdicts, [None if v == GOLD_INVALID else float(v == CORRECT) for v in verdicts])


class Scripted:
    """collect_rollouts' inputs for `script`: the real PromptSampler (its position after a step is checked too), a
    RolloutSource over the scripted engine and scorer, and the dynamic-sampling settings."""

    def __init__(self, script: str, prompts_per_step: int, mini_batches: int = 1, **dynamic_sampling):
        examples = [Example(f"p{i}", f"problem {i}", f"gold {i}") for i in range(NUM_EXAMPLES)]
        order = PromptSampler(examples, NUM_EXAMPLES, seed=0).next_batch()
        self.draw_order = [ex.uid for ex in order]
        self.sampler = PromptSampler(examples, prompts_per_step, seed=0)
        self.engine = self.make_engine()
        scorer = ScriptedScorer({ex.answer: VERDICTS[kind] for ex, kind in zip(order, script)})
        prompts = Prompts(self.sampler, encode=lambda example: [int(example.uid[1:])],
                          decode=lambda ids: ["text"] * len(ids))
        self.source = RolloutSource(self.engine, scorer, prompts, SamplingParams(G, 4), Schedule(0, prompts_per_step, 10),
                                    seed_base=0)
        self.prompts_per_step, self.mini_batches = prompts_per_step, mini_batches
        self.sampling = replace(DynamicSamplingConfig(enabled=True), **dynamic_sampling)

    def make_engine(self) -> ScriptedEngine:
        return ScriptedEngine()

    def collect(self, step: int) -> RolloutBatch:
        # one process: keep_partial splits the batch over the mini-batches alone; the engine holds the version step
        # `step` samples with
        self.engine.load(SimpleNamespace(version=step - 1))
        return collect_rollouts(step, self.source, self.prompts_per_step, self.sampling, resolve(RewardConfig(), {}),
                                parts=self.mini_batches, timings=Timings())

    def uids(self, positions: list[int]) -> list[str]:
        return [self.draw_order[i] for i in positions]

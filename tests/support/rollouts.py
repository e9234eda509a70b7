"""A scripted stand-in for what collect_rollouts reads of a RunContext."""

from __future__ import annotations

import contextlib
from dataclasses import replace
from types import SimpleNamespace

import torch

from tokenpo.algorithms.config import DynamicSamplingConfig
from tokenpo.data import Example, PromptSampler
from tokenpo.rewards import CORRECT, GOLD_INVALID, WRONG
from tokenpo.rollout.engine import Responses, SamplingParams

G = 2
# a group's verdicts: mixed, all right, all wrong, gold answer that does not parse
VERDICTS = {"M": [CORRECT, WRONG], "R": [CORRECT, CORRECT], "W": [WRONG, WRONG], "I": [GOLD_INVALID, GOLD_INVALID]}
NUM_EXAMPLES = 40


class ScriptedContext:
    """What collect_rollouts reads of a RunContext; the prompt drawn i-th (in the sampler's order) gets the
    verdicts of script[i]. The sampler is the real PromptSampler, so its position after a step is checked too."""

    def __init__(self, script: str, prompts_per_step: int, mini_batches: int = 1, **dynamic_sampling):
        examples = [Example(f"p{i}", f"problem {i}", f"gold {i}") for i in range(NUM_EXAMPLES)]
        order = PromptSampler(examples, NUM_EXAMPLES, seed=0).next_batch()
        self.pattern = {ex.answer: VERDICTS[kind] for ex, kind in zip(order, script)}
        self.draw_order = [ex.uid for ex in order]
        self.sampler = PromptSampler(examples, prompts_per_step, seed=0)
        self.cfg = SimpleNamespace(data=SimpleNamespace(prompts_per_step=prompts_per_step),
                                   trainer=SimpleNamespace(mini_batches=mini_batches),
                                   algorithm=SimpleNamespace(dynamic_sampling=replace(
                                       DynamicSamplingConfig(enabled=True), **dynamic_sampling)))
        self.tokenizer = SimpleNamespace(batch_decode=lambda ids, skip_special_tokens: ["text"] * len(ids))
        self.scorer = SimpleNamespace(score=lambda text, golds: self._verdicts(golds))
        self.rounds_drawn: list[int] = []

    def _verdicts(self, golds: list[str]) -> list[str]:
        return [v for start in range(0, len(golds), G) for v in self.pattern[golds[start]]]

    def sampling_params(self) -> SamplingParams:
        return SamplingParams(G, 4)

    def rollout_generator(self, step: int, round_index: int) -> torch.Generator:
        self.rounds_drawn.append(round_index)
        return torch.Generator()

    def prompt_ids(self, example: Example) -> list[int]:
        return [int(example.uid[1:])]

    @contextlib.contextmanager
    def timings(self, phase: str):
        yield

    def generate(self, prompt_ids, params, generator):
        return Responses(token_ids=[[7] for _ in prompt_ids for _ in range(G)], truncated=[False] * (len(prompt_ids) * G))

    def uids(self, positions: list[int]) -> list[str]:
        return [self.draw_order[i] for i in positions]

"""The rollout engine interface: prompt token ids in, response token ids (and log-probs where known) out.

An engine is a function registered by name; the trainer only calls `get_engine(name)(...)`, so a vLLM or
SGLang engine for GPUs plugs in here without touching the trainer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from tokenpo.registry import Registry


@dataclass(frozen=True)
class SamplingParams:
    num_samples: int
    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    stop_token_ids: tuple[int, ...] = ()
    share_prefill: bool = True


@dataclass
class Responses:
    """Responses ordered prompt-major: the samples of prompt i are rows i*G .. i*G+G-1."""

    token_ids: list[list[int]]
    truncated: list[bool]
    # log-probs of the sampled tokens under the sampling distribution, where the engine has them
    logprobs: list[list[float]] | None = None


class Engine(Protocol):
    def __call__(
        self, model, prompt_ids: list[list[int]], params: SamplingParams, pad_id: int, generator: torch.Generator
    ) -> Responses: ...


ENGINES = Registry("rollout.engine")


def get_engine(name: str) -> Engine:
    return ENGINES.get(name)

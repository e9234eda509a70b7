"""A version of the policy's weights as it leaves the policy (`Policy.publish`), the only way it does: the tensors in
the base model's names (LoRA merged, ZeRO-3 gathered module by module, so no rank holds a second full copy), or, for
a generator in the trainer's own process, the live module for the length of a `with`. Generators
(tokenpo.rollout.generator) load it."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from tokenpo.models.lora import base_model
from tokenpo.models.weight_stream import policy_weights


@dataclass(frozen=True)
class Published:
    """Version `version` of the policy (the policy after that many rollout steps' updates)."""

    version: int
    # (name, tensor) of every weight of the base model, one module at a time; under ZeRO-3 each module is gathered
    # while it is handed over, a collective: every rank iterates the whole stream
    tensors: Callable[[], Iterator[tuple[str, torch.Tensor]]]
    # for a generator in the trainer's process: the live module ready to generate (ZeRO-3 gathered for the `with`)
    module: Callable[[], contextlib.AbstractContextManager[torch.nn.Module]]
    # the base model's Hugging Face config and its weights' dtype (what a generator builds its own model from)
    config: object
    dtype: torch.dtype
    architecture: str  # the base model's class (LlamaForCausalLM): what a config made in memory does not name

    @classmethod
    def of_module(cls, module: torch.nn.Module, version: int = 0) -> Published:
        """A plain module in this process as version `version` (evaluation: no DeepSpeed, no partition)."""
        return published(module, version, partitioned=False, lend=lambda: contextlib.nullcontext(module))


def published(module: torch.nn.Module, version: int, *, partitioned: bool,
              lend: Callable[[], contextlib.AbstractContextManager[torch.nn.Module]]) -> Published:
    """`module` (a PEFT model with LoRA) as version `version`: its weights streamed in the base model's names, a LoRA
    layer merged, each module gathered while it is read when `partitioned` (ZeRO-3); `lend` lends the live module."""
    base = base_model(module)
    return Published(version, lambda: policy_weights(module, partitioned), lend, base.config,
                     next(module.parameters()).dtype, type(base).__name__)

"""The policy's weights as a generator with its own copy of them (vLLM, the generation-ahead process) loads them:
(name, tensor) pairs in the base model's Hugging Face names, one module at a time (what `Policy.publish` hands out).

Where PEFT wrapped a module (adapted layers, `modules_to_save`), tokenpo.models.lora says what stands for it: an
adapted layer's W + scale·B·A, computed while that layer is handed over into a new tensor (the training weights are
never touched), under the base layer's name; a module that PEFT trains in full from its trained copy. The engine thus
needs no adapter support.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from tokenpo.models.lora import base_model, merged_layer_weights, streamed_instead


@dataclass(frozen=True)
class Gathered:
    """How a module's parameters are read in full: under ZeRO-3 gathered from every rank's shard (a collective: every
    rank walks the same modules) for the length of a `with`, and released on exit."""

    partitioned: bool  # ZeRO-3: each rank holds a shard of every parameter

    def __call__(self, params: list[torch.Tensor]) -> contextlib.AbstractContextManager:
        if not self.partitioned:
            return contextlib.nullcontext()
        import deepspeed

        return deepspeed.zero.GatheredParameters(params)

    def owned(self, tensor: torch.Tensor) -> torch.Tensor:
        # the gathered storage is released when the context exits, and a reload may still hold the tensor
        return tensor.clone() if self.partitioned else tensor


def _walk(module: torch.nn.Module, prefix: str, gathered: Gathered) -> Iterator[tuple[str, torch.Tensor]]:
    whole = None  # a module streamed as one (an adapted layer, a PEFT wrapper): its submodules are not walked again
    for name, sub in module.named_modules(prefix=prefix):
        if whole is not None and name.startswith(whole + "."):
            continue
        merged = merged_layer_weights(sub, name, gathered, gathered.owned)
        if merged is not None:
            whole = name
            yield from merged
            continue
        instead = streamed_instead(sub, name)
        if instead is not None:
            whole = name
            yield from _walk(instead, name, gathered)
            continue
        params = list(sub.named_parameters(prefix=name, recurse=False))
        if params:
            with gathered([param for _, param in params]):
                owned = [(n, gathered.owned(param.detach())) for n, param in params]
            yield from owned


def policy_weights(module: torch.nn.Module, partitioned: bool) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) of every weight the engine's model has, one module at a time, in the base model's names.

    Under ZeRO-3 a module's shards are gathered only while that module is handed over (an adapted layer: its base
    weight and adapter matrices together), never the whole model at once.
    """
    yield from _walk(base_model(module), "", Gathered(partitioned))

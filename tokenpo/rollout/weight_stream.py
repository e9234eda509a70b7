"""The policy's weights as an engine with its own copy of them (vLLM) loads them: (name, tensor) pairs in the
base model's Hugging Face names, one module at a time.

A LoRA policy (PEFT) streams merged weights: each adapted layer's W + scale·B·A, computed while that layer is
handed over, into a new tensor (the training weights are never touched), under the base layer's name; the
adapter matrices themselves are not sent, and a module that PEFT trains in full (`modules_to_save`) is sent
from its trained copy. The engine thus needs no LoRA support and runs the adapted model at the base model's
speed (verl and OpenRLHF sync LoRA policies to vLLM the same way).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from peft.tuners.lora import Embedding, Linear, LoraLayer
from peft.utils import AuxiliaryTrainingWrapper, ModulesToSaveWrapper

from tokenpo.errors import ConfigError
from tokenpo.models.lora import is_lora, merged_weight


def peft_base(module: torch.nn.Module) -> torch.nn.Module:
    """The model a PEFT wrapper holds (its LoRA layers in place), whose parameter names are the base model's;
    any other module as it is."""
    return module.get_base_model() if is_lora(module) else module


def _gathered(params: list[torch.Tensor], zero3: bool):
    """Context in which `params` hold their full data: under ZeRO-3 their shards are gathered (a collective:
    every rank walks the same modules) and released on exit."""
    if not zero3:
        return contextlib.nullcontext()
    import deepspeed

    return deepspeed.zero.GatheredParameters(params)


def _owned(tensor: torch.Tensor, zero3: bool) -> torch.Tensor:
    # the gathered storage is released when the context exits, and a reload may still hold the tensor
    return tensor.clone() if zero3 else tensor


def _lora_layer_weights(layer, prefix: str, zero3: bool) -> list[tuple[str, torch.Tensor]]:
    """A LoRA layer's base parameters with the active adapters merged in, as `prefix.weight` (and `.bias`)."""
    if not isinstance(layer, (Linear, Embedding)):
        raise ConfigError(f"model.lora: the merged-weight sync to the rollout engine handles LoRA on Linear and "
                          f"Embedding layers; {prefix} is a {type(layer).__name__}")
    embedding = isinstance(layer, Embedding)
    # what the layer's forward adds: nothing while adapters are off or already merged into the base weight
    adapters = [] if layer.disable_adapters or layer.merged else [
        a for a in layer.active_adapters if a in (layer.lora_embedding_A if embedding else layer.lora_A)]
    for adapter in adapters:
        if adapter in layer.lora_variant or layer.lora_bias.get(adapter):
            raise ConfigError(f"model.lora: the merged-weight sync handles plain LoRA (W + scale·B·A); {prefix} has "
                              f"a LoRA variant or bias for adapter {adapter!r}")
    base = layer.get_base_layer()
    with _gathered(list(layer.parameters()), zero3):
        weight = base.weight.detach()
        for adapter in adapters:
            if embedding:
                a, b = layer.lora_embedding_A[adapter], layer.lora_embedding_B[adapter]
            else:
                a, b = layer.lora_A[adapter].weight, layer.lora_B[adapter].weight
            weight = merged_weight(weight, a.detach(), b.detach(), layer.scaling[adapter],
                                   embedding or getattr(layer, "fan_in_fan_out", False))
        out = [(f"{prefix}.weight", weight if adapters else _owned(weight, zero3))]
        if getattr(base, "bias", None) is not None:
            out.append((f"{prefix}.bias", _owned(base.bias.detach(), zero3)))
    return out


def _walk(module: torch.nn.Module, prefix: str, zero3: bool) -> Iterator[tuple[str, torch.Tensor]]:
    whole = None  # a LoRA layer or PEFT wrapper streamed as one: its submodules are not walked again
    for name, sub in module.named_modules(prefix=prefix):
        if whole is not None and name.startswith(whole + "."):
            continue
        if isinstance(sub, LoraLayer):
            whole = name
            yield from _lora_layer_weights(sub, name, zero3)
        elif isinstance(sub, ModulesToSaveWrapper):
            # the trained copy while its adapter is active, else the original, under the wrapped module's name
            whole, active = name, sub.active_adapters
            yield from _walk(sub.modules_to_save[active[0]] if active else sub.original_module, name, zero3)
        elif isinstance(sub, AuxiliaryTrainingWrapper):
            raise ConfigError(f"model.lora: the merged-weight sync has no rule for PEFT's {type(sub).__name__} "
                              f"({name})")
        else:
            params = list(sub.named_parameters(prefix=name, recurse=False))
            if params:
                with _gathered([param for _, param in params], zero3):
                    owned = [(n, _owned(param.detach(), zero3)) for n, param in params]
                yield from owned


def policy_weights(module: torch.nn.Module, zero3: bool) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) of every weight the engine's model has, one module at a time, in the base model's names.

    Under ZeRO-3 a module's shards are gathered only while that module is handed over (a LoRA layer: its base
    weight and adapter matrices together), never the whole model at once.
    """
    yield from _walk(peft_base(module), "", zero3)

"""One rank of test_weight_stream: a ZeRO-3 policy's weights streamed as the vllm engine's sync reads them.

    python tests/models/weight_stream_ranks.py <out dir>   (as every rank of a process group; see run_ranks)

Writes `<out>/rank<r>.pt`: {"full" | "lora": {"weights": {name: tensor}, "gathered_elsewhere": [names of
parameters of other modules that were gathered while a module's weights were handed over]}} for the plain tiny
policy and a LoRA one.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from support.config import SMALL, compose_config
from tokenpo.deepspeed import dist
from tokenpo.deepspeed.engine import build_policy_engine
from tokenpo.models.loading import load_model
from tokenpo.models.weight_stream import policy_weights
from tokenpo.trainer.core.optim import build_optimizer


# the LoRA policy of the test: rank 4 on every linear layer
LORA = ["model.lora.rank=4", "model.lora.alpha=8"]


def policy_model(lora: bool):
    """The tiny policy, plain or with LoRA adapters whose B is random (PEFT starts it at 0, which merges to the
    base weights and would hide a missing merge); the same on every rank and in the test."""
    cfg, _ = compose_config(SMALL + ["deepspeed=zero3"] + (LORA if lora else []))
    torch.manual_seed(cfg.seed)  # PEFT draws A from the global generator; the trainer seeds it the same way
    _, model = load_model(cfg.model, cfg.seed)
    generator = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if ".lora_B." in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.1)
    return cfg, model


def stream(lora: bool) -> dict:
    cfg, model = policy_model(lora)
    policy = build_policy_engine(model, build_optimizer(model, cfg.trainer), cfg.deepspeed, micro_batch_size=4,
                                 max_grad_norm=1.0, world_size=dist.world_size())
    weights, gathered_elsewhere = {}, []
    for name, tensor in policy_weights(policy.module, partitioned=True):
        module_prefix = name.rpartition(".")[0] + "."
        # a parameter is gathered iff its full data is present (ZeRO-3 leaves an empty tensor otherwise); a LoRA
        # layer's base weight and factors are its own (PEFT names: base_model.model.<module>.base_layer.weight, ...)
        gathered_elsewhere += [other for other, p in policy.module.named_parameters() if p.data.numel()
                               and not other.removeprefix("base_model.model.").startswith(module_prefix)]
        weights[name] = tensor
    return {"weights": weights, "gathered_elsewhere": gathered_elsewhere}


def main(out: Path) -> None:
    dist.init_distributed("gloo")
    torch.save({"full": stream(lora=False), "lora": stream(lora=True)}, out / f"rank{dist.rank()}.pt")


if __name__ == "__main__":
    main(Path(sys.argv[1]))

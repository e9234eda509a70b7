"""One rank of test_weight_stream: a ZeRO-3 policy's weights streamed as the vllm engine's sync reads them.

    python tests/rollout/weight_stream_ranks.py <out dir>   (as every rank of a process group; see run_ranks)

Writes `<out>/rank<r>.pt`: {"weights": {name: tensor}, "gathered_elsewhere": [names of parameters of other
modules that were gathered while a module's weights were handed over]}.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from multiproc_util import SMALL, compose_config

from tokenpo.deepspeed import dist
from tokenpo.deepspeed.engine import build_policy_engine
from tokenpo.models.loading import load_model
from tokenpo.rollout.vllm_engine import policy_weights
from tokenpo.trainer.optim import build_optimizer


def main(out: Path) -> None:
    dist.init_distributed("gloo")
    cfg, _ = compose_config(SMALL + ["deepspeed=zero3"])
    _, model = load_model(cfg.model, cfg.seed)
    policy = build_policy_engine(model, build_optimizer(model, cfg.trainer), cfg.deepspeed, micro_batch_size=4,
                                 max_grad_norm=1.0, world_size=dist.world_size())
    weights, gathered_elsewhere = {}, []
    for name, tensor in policy_weights(policy.module, zero3=True):
        module_prefix = name.rpartition(".")[0]
        # a parameter is gathered iff its full data is present (ZeRO-3 leaves an empty tensor otherwise)
        gathered_elsewhere += [other for other, p in policy.module.named_parameters()
                               if p.data.numel() and other.rpartition(".")[0] != module_prefix]
        weights[name] = tensor
    torch.save({"weights": weights, "gathered_elsewhere": gathered_elsewhere}, out / f"rank{dist.rank()}.pt")


if __name__ == "__main__":
    main(Path(sys.argv[1]))

"""Run by every rank of test_accumulation.py: `python accumulation_ranks.py <out_dir> <stage> ...` (RANK / WORLD_SIZE /
MASTER_* set); the one-process test calls `write_updates` itself.

Per ZeRO stage, one SGD step (lr 1, so the update is the gradient) of a fresh seeded model in tokenpo's policy
engine (tokenpo.deepspeed.engine.build_policy_engine: engine_json's caller-owned accumulation), from this rank's
rows either as two micro-batches, each backward as the trainer does it (a share of the global mean loss, times the
world size, scale_wrt_gas=False), then engine.step(); or as one micro-batch holding both. Rank 0 writes
`<stage>-<way>.pt`: {parameter name: initial weight - updated weight}.
"""

from __future__ import annotations

import sys
from pathlib import Path

import deepspeed
import torch

from tokenpo.deepspeed import dist
from tokenpo.deepspeed.config import DeepSpeedConfig
from tokenpo.deepspeed.engine import build_policy_engine

# rows per micro-batch on each rank: unequal, so a micro-batch's share of the mean must come from the global count
MICRO_ROWS = (3, 5)
WAYS = ("accumulated", "whole")
IN, HIDDEN, OUT = 64, 2048, 4
SEED = 7


def tiny_model() -> torch.nn.Module:
    """The same weights on every rank. The first layer's 131k weights are over ZeRO-3's persistence threshold
    (100k elements, left whole on every rank below it), so ZeRO-3 partitions it; the others stay whole."""
    torch.manual_seed(SEED)
    return torch.nn.Sequential(torch.nn.Linear(IN, HIDDEN), torch.nn.Tanh(), torch.nn.Linear(HIDDEN, OUT))


def rank_rows(rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, targets) of one rank: sum(MICRO_ROWS) rows, different on each rank."""
    gen = torch.Generator().manual_seed(100 + rank)
    rows = sum(MICRO_ROWS)
    return torch.randn(rows, IN, generator=gen), torch.randn(rows, OUT, generator=gen)


def loss_share(model, inputs: torch.Tensor, targets: torch.Tensor, global_rows: int) -> torch.Tensor:
    """These rows' share of the mean squared error over all ranks' rows (summing the shares gives the mean)."""
    return ((model(inputs) - targets) ** 2).sum() / global_rows


def micro_batches(way: str, inputs: torch.Tensor, targets: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    if way == "whole":
        return [(inputs, targets)]
    return list(zip(inputs.split(MICRO_ROWS), targets.split(MICRO_ROWS)))


def full_weights(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter whole (gathered under ZeRO-3: a collective, so every rank calls it)."""
    params = dict(module.named_parameters())
    with deepspeed.zero.GatheredParameters(list(params.values())):
        return {name: p.detach().clone() for name, p in params.items()}


def one_update(stage: int, way: str) -> dict[str, torch.Tensor]:
    model = tiny_model()
    world = dist.world_size()
    engine = build_policy_engine(model, torch.optim.SGD(model.parameters(), lr=1.0), DeepSpeedConfig(stage=stage),
                                 micro_batch_size=max(MICRO_ROWS), max_grad_norm=0.0, world_size=world)
    before = full_weights(engine.module)
    inputs, targets = rank_rows(dist.rank())
    for batch_inputs, batch_targets in micro_batches(way, inputs, targets):
        loss = loss_share(engine, batch_inputs, batch_targets, global_rows=world * sum(MICRO_ROWS))
        # as tokenpo.trainer.core.policy.Policy.backward does: DeepSpeed averages gradients over ranks
        engine.backward(loss * world, scale_wrt_gas=False)
    engine.step()
    after = full_weights(engine.module)
    return {name: before[name] - after[name] for name in before}


def write_updates(out: Path, stages: list[int]) -> None:
    """Every rank calls it, in a process group; rank 0 writes."""
    out.mkdir(parents=True, exist_ok=True)
    for stage in stages:
        for way in WAYS:
            update = one_update(stage, way)
            if dist.is_main():
                torch.save(update, out / f"zero{stage}-{way}.pt")


def main(out: Path, stages: list[int]) -> None:
    # one intra-op thread per process, as support.config.SMALL runs them (two ranks share two cores)
    torch.set_num_threads(1)
    dist.init_distributed("gloo")
    write_updates(out, stages)


if __name__ == "__main__":
    main(Path(sys.argv[1]), [int(stage) for stage in sys.argv[2:]])

"""How far a bf16 update is from the fp32 one, with gradients summed in bf16 or in fp32 (deepspeed.grad_dtype), on 2
gloo processes (CPU) at every ZeRO stage.

Each rank runs K micro-batches of its own random rows through accumulation_ranks' seeded model (a 64 -> 2048 -> 4 MLP)
in tokenpo's policy engine (engine_json; caller-owned accumulation, each backward as the trainer's), then one SGD step
at lr 1, so the update is the summed gradient. The fp32 engine's update is the reference; the figure is
||update_bf16 - update_fp32|| / ||update_fp32|| over all parameters, from the fp32 master weights. Part of it is bf16's
own forward and backward, the same under both settings; the difference between the two columns is the summation.

    .venv/bin/python scripts/bf16_grad_sums.py [--micro-batches 16]

docs/distributed.md quotes its output.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests"), str(REPO / "tests" / "deepspeed")]

STAGES = (0, 1, 2, 3)
ROWS = 8  # rows per micro-batch


def full_fp32(param):
    """The fp32 master value of `param` (gathered under ZeRO-3); the parameter itself where no optimizer keeps one."""
    import deepspeed

    master = deepspeed.utils.safe_get_full_fp32_param(param)
    return (param.detach() if master is None else master).float().clone()


def update(stage: int, precision: str, grad_dtype: str, micro_batches: int) -> dict:
    import accumulation_ranks as model_of
    import torch

    from tokenpo.deepspeed import dist
    from tokenpo.deepspeed.config import DeepSpeedConfig
    from tokenpo.deepspeed.engine import build_policy_engine

    model = model_of.tiny_model()
    world = dist.world_size()
    ds = DeepSpeedConfig(stage=stage, precision=precision, grad_dtype=grad_dtype)
    engine = build_policy_engine(model, torch.optim.SGD(model.parameters(), lr=1.0), ds, micro_batch_size=ROWS,
                                 max_grad_norm=0.0, world_size=world)
    params = dict(engine.module.named_parameters())
    before = {name: full_fp32(p) for name, p in params.items()}
    gen = torch.Generator().manual_seed(100 + dist.rank())
    dtype = next(engine.module.parameters()).dtype
    for _ in range(micro_batches):
        inputs = torch.randn(ROWS, model_of.IN, generator=gen)
        targets = torch.randn(ROWS, model_of.OUT, generator=gen)
        loss = ((engine(inputs.to(dtype)).float() - targets) ** 2).sum() / (world * ROWS * micro_batches)
        engine.backward(loss * world, scale_wrt_gas=False)  # as tokenpo.trainer.core.policy.Policy.backward
    engine.step()
    return {name: before[name] - full_fp32(p) for name, p in params.items()}


def relative_distance(got: dict, want: dict) -> float:
    num = sum(float(((got[k] - want[k]).double() ** 2).sum()) for k in want) ** 0.5
    return num / sum(float((want[k].double() ** 2).sum()) for k in want) ** 0.5


def rank_main(out: Path, micro_batches: int) -> None:
    from tokenpo.deepspeed import dist

    dist.init_distributed("gloo")
    rows = []
    for stage in STAGES:
        reference = update(stage, "fp32", "fp32", micro_batches)
        distances = {grad_dtype: relative_distance(update(stage, "bf16", grad_dtype, micro_batches), reference)
                     for grad_dtype in ("bf16", "fp32")}
        rows.append({"stage": stage, **distances})
    if dist.is_main():
        out.write_text(json.dumps(rows))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--micro-batches", type=int, default=16, help="micro-batches per rank (default %(default)s)")
    args = parser.parse_args(argv)
    from support.runs import run_ranks

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rows.json"
        run_ranks(Path(__file__), ["--rank", str(out), str(args.micro_batches)], 2, Path(tmp) / "logs",
                  timeout_s=900)
        rows = json.loads(out.read_text())
    print(f"2 processes x {args.micro_batches} micro-batches of {ROWS} rows; ||update_bf16 - update_fp32|| / "
          "||update_fp32||")
    print(f"{'ZeRO':>4} {'grad_dtype=bf16':>16} {'grad_dtype=fp32':>16}")
    for row in rows:
        print(f"{row['stage']:>4} {row['bf16']:>16.5f} {row['fp32']:>16.5f}")
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--rank"]:
        rank_main(Path(sys.argv[2]), int(sys.argv[3]))
    else:
        sys.exit(main(sys.argv[1:]))

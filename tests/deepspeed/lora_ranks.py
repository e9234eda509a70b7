"""Run by every rank of test_lora_stages.py: `python lora_ranks.py <out_dir>` (RANK / WORLD_SIZE / MASTER_* set).

LoRA runs of 2 steps on 2 processes, with gradient accumulation (one group per micro-batch) and two updates per
rollout, under every ZeRO stage (`<stage>/`); under ZeRO-3 the same run stopped after step 1 and resumed
(`zero3_resumed/`); under ZeRO-2 with activation checkpointing and an entropy bonus, and without checkpointing
(`zero2_entropy_checkpointed/`, `zero2_entropy/`).
"""

from __future__ import annotations

import sys
from pathlib import Path


from support.config import SMALL
from support.runs import train_run
from tokenpo.deepspeed import dist

STAGES = ("zero0", "zero1", "zero2", "zero3")
LORA = SMALL + ["model.lora.rank=4", "trainer.lr=1e-2", "trainer.warmup_steps=0", "trainer.mini_batches=2",
                "trainer.micro_batch_size=2"]
ENTROPY = ["deepspeed=zero2", "trainer.max_steps=2", "algorithm.loss.entropy_coef=0.01"]


def main(out: Path) -> None:
    dist.init_distributed("gloo")
    for stage in STAGES:
        train_run(out / stage, LORA + [f"deepspeed={stage}", "trainer.max_steps=2"])
    resumed = LORA + ["deepspeed=zero3", "trainer.save_every=1"]
    train_run(out / "zero3_resumed", resumed + ["trainer.max_steps=1"])
    train_run(out / "zero3_resumed", resumed + ["trainer.max_steps=2", "trainer.resume=auto"])
    train_run(out / "zero2_entropy", LORA + ENTROPY)
    train_run(out / "zero2_entropy_checkpointed", LORA + ENTROPY + ["model.gradient_checkpointing=true"])


if __name__ == "__main__":
    main(Path(sys.argv[1]))

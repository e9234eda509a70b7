"""Run by every rank of test_zero3_lora_resume.py: `python zero3_lora_ranks.py <out_dir>` (RANK / WORLD_SIZE / MASTER_*
set).

ZeRO-3 with LoRA adapters, activation checkpointing and the recomputed output layer (trainer.recompute_head) on the
tiny model: 3 uninterrupted steps (`whole/`), 2 steps saving a checkpoint after each, then resumed to step 3
(`resumed/`), and 3 steps with neither activation checkpointing nor the recomputed head (`plain/`).
"""

from __future__ import annotations

import sys
from pathlib import Path

from multiproc_util import SMALL, train_run

from tokenpo.deepspeed import dist

PLAIN = SMALL + ["deepspeed=zero3", "model.lora.rank=8", "trainer.lr=1e-2", "trainer.warmup_steps=0",
                 "trainer.save_every=1", "eval.max_problems=1"]
RUN = PLAIN + ["model.gradient_checkpointing=true", "trainer.recompute_head=true"]


def main(out: Path) -> None:
    dist.init_distributed("gloo")
    train_run(out / "whole", RUN + ["trainer.max_steps=3"])
    train_run(out / "resumed", RUN + ["trainer.max_steps=2"])
    train_run(out / "resumed", RUN + ["trainer.max_steps=3", "trainer.resume=auto"])
    train_run(out / "plain", PLAIN + ["trainer.max_steps=3"])


if __name__ == "__main__":
    main(Path(sys.argv[1]))

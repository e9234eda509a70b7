"""Run by every rank of test_resume.py: `python resume_ranks.py <out_dir>` (RANK / WORLD_SIZE / MASTER_* set).

- `A/`: 3 uninterrupted steps;
- `B/`: the same run saving every step, whose save of step 2 is killed midway (the engine writes part of its
  files, then the process "dies": an exception on every rank), then `B/` again with trainer.resume=auto;
- `C/`: a new run dir resumed from `B/checkpoints/step_000002` by path.
B logs to W&B in offline mode, so the run id its resumed half continues can be read from `B/wandb/`.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import wandb
from deepspeed.runtime.engine import DeepSpeedEngine

from support.config import SMALL
from support.runs import train_run
from tokenpo.deepspeed import dist

STAGE = "zero3"
RUN = SMALL + [f"deepspeed={STAGE}", "trainer.max_steps=3"]
KILLED_STEP = 2


class SaveKilled(Exception):
    """Stands for the process dying in the middle of writing a checkpoint."""


def save_killed_at(step: int):
    original = DeepSpeedEngine.save_checkpoint

    def save_checkpoint(self, save_dir, *args, **kwargs):
        if Path(save_dir).name.endswith(f"step_{step:06d}"):
            partial = Path(save_dir) / "state"
            partial.mkdir(parents=True, exist_ok=True)
            (partial / f"partial_rank{dist.rank()}.pt").write_bytes(b"half a checkpoint")
            raise SaveKilled(save_dir)
        return original(self, save_dir, *args, **kwargs)

    return save_checkpoint


def main(out: Path) -> None:
    logging.basicConfig(level=logging.INFO)
    dist.init_distributed("gloo")
    train_run(out / "A", RUN)
    original = DeepSpeedEngine.save_checkpoint
    DeepSpeedEngine.save_checkpoint = save_killed_at(KILLED_STEP)
    try:
        train_run(out / "B", RUN + ["trainer.save_every=1", "logger.mode=offline"])
        raise AssertionError("the save of step 2 should have been killed")
    except SaveKilled:
        # a dead process leaves its W&B run behind; this one lives on, so close the run as death would
        wandb.finish()
    finally:
        DeepSpeedEngine.save_checkpoint = original
    train_run(out / "B", RUN + ["trainer.save_every=1", "logger.mode=offline", "trainer.resume=auto"])
    train_run(out / "C", RUN + [f"trainer.resume={out / 'B' / 'checkpoints' / 'step_000002'}"])


if __name__ == "__main__":
    main(Path(sys.argv[1]))

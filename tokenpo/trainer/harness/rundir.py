"""Run-dir housekeeping: earlier results a new run must not mix with are moved aside, never deleted."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from tokenpo.trainer.harness.environment import ENVIRONMENT_FILE

log = logging.getLogger("tokenpo")

# what a run writes into its run dir; train.log stays where it is (Hydra's log file, open before any of this runs,
# appended to by every start)
# the run's resolved config, which the workers of a trainer.nproc=N job read (tokenpo.trainer.processes.launch)
RESOLVED = "resolved_config.json"
RESULTS = (".hydra", RESOLVED, ENVIRONMENT_FILE, "metrics.jsonl", "eval_before.json", "eval_after.json",
           "summary.json", "final", "checkpoints", "wandb")
# eval.extra benchmarks' records: eval_before.<name>.json, eval_after.<name>.json
EXTRA_EVALS = "eval_*.*.json"
# why a run dir holds nothing to resume: what a resume says where it finds no checkpoint
NO_CHECKPOINT = ("it saved no checkpoint: trainer.save_every=0, the default, saves one only when a signal stops the "
                 "run; trainer.save_every=N saves one every N steps")
# checkpoints that an earlier start set aside (checkpoint.set_aside_stale) belong to the earlier run as well
EARLIER_CHECKPOINTS = "checkpoints.previous-*"


def move_aside(paths: list[Path], stem: Path) -> Path:
    """Move `paths` into a new folder `<stem>.previous-<YYYYmmdd-HHMMSS>` next to `stem` (`-2`, `-3`... when that
    name is taken), keeping their names; return the folder. Renames only: the paths must be on its filesystem."""
    base = stem.with_name(f"{stem.name}.previous-{time.strftime('%Y%m%d-%H%M%S')}")
    folder, attempt = base, 1
    while folder.exists():
        attempt += 1
        folder = base.with_name(f"{base.name}-{attempt}")
    folder.mkdir(parents=True)
    for path in paths:
        os.replace(path, folder / path.name)
    return folder


def continues_here(run_dir: Path, resume: str) -> bool:
    """Whether a start with `trainer.resume=<resume>` continues the run in `run_dir` from one of its checkpoints
    (`checkpoint.find_resume_dir` picks and verifies which) rather than starting a new run there."""
    if resume == "none":
        return False
    if resume == "auto":
        return any(path.is_dir() for path in (run_dir / "checkpoints").glob("step_*"))
    return Path(resume).resolve().is_relative_to(run_dir.resolve())


def set_aside_earlier_run(run_dir: Path) -> Path | None:
    """Move what an earlier run left in `run_dir` into `<run_dir>/results.previous-<time>/` (one log line), so that a
    new run there overwrites none of it; the folder, or None when there was nothing. Rank 0, before the run starts."""
    earlier = [run_dir / name for name in RESULTS if (run_dir / name).exists()]
    earlier += sorted(run_dir.glob(EXTRA_EVALS)) + sorted(run_dir.glob(EARLIER_CHECKPOINTS))
    if not earlier:
        return None
    folder = move_aside(earlier, run_dir / "results")
    why = "" if (run_dir / "checkpoints").exists() or (folder / "checkpoints").exists() else (
        f" ({NO_CHECKPOINT})")
    log.warning("%s held a run that this start does not resume%s: moved %s to %s (train.log keeps every start's log)",
                run_dir, why, ", ".join(path.name for path in earlier), folder)
    return folder

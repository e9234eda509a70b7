"""Resumable checkpoints: model, optimizer, LR scheduler, data position, RNG states of every rank, step, W&B id.

Layout under `<run_dir>/checkpoints/`: `step_000004/` (DeepSpeed's `state/` folder, `rng_rank<r>.pt` per rank,
`tokenpo.json` with the step and number of processes) and `latest` (JSON naming the newest complete one).
A checkpoint is written into a hidden temporary folder and renamed into place only after every rank finished
writing, then `latest` is replaced atomically: an interrupted save never becomes the one resumed from.
Every rank writes its own shards into the same folder, so a multi-node run dir must be on a shared filesystem.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

import numpy as np
import torch
import torch.distributed as torch_dist

from tokenpo.deepspeed import dist
from tokenpo.errors import ConfigError

TAG = "state"
META = "tokenpo.json"
LATEST = "latest"
TMP_PREFIX = ".tmp-"


def _barrier() -> None:
    if dist.world_size() > 1:
        torch_dist.barrier()


def rng_state() -> dict:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def _replace_text(path: Path, text: str) -> None:
    """Write `text` to `path` atomically (a reader sees the old or the new content, never a mix)."""
    tmp = path.with_name(f"{TMP_PREFIX}{path.name}")
    tmp.write_text(text)
    os.replace(tmp, path)


def save(engine, root: Path, step: int, client_state: dict, keep_last: int) -> Path:
    """Write checkpoint `step` on every rank (a collective); keep the newest `keep_last` ones."""
    final = root / f"step_{step:06d}"
    tmp = root / f"{TMP_PREFIX}step_{step:06d}"
    if dist.is_main():
        root.mkdir(parents=True, exist_ok=True)
        # leftovers of saves that were killed midway
        for stale in root.glob(f"{TMP_PREFIX}step_*"):
            shutil.rmtree(stale)
    _barrier()
    engine.save_checkpoint(str(tmp), tag=TAG, client_state=client_state, save_latest=False)
    torch.save(rng_state(), tmp / f"rng_rank{dist.rank()}.pt")
    _barrier()
    if dist.is_main():
        meta = {"step": step, "world_size": dist.world_size(), "zero_stage": engine.zero_optimization_stage()}
        (tmp / META).write_text(json.dumps(meta))
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        _replace_text(root / LATEST, json.dumps({"step": step, "path": final.name}))
        for old in sorted(root.glob("step_*"))[:-keep_last]:
            shutil.rmtree(old)
    _barrier()
    return final


def find_resume_dir(resume: str, run_dir: Path) -> Path | None:
    """`auto`: the latest checkpoint of this run dir, if any; `none`; or a checkpoint folder / run dir path."""
    if resume == "none":
        return None
    root = run_dir / "checkpoints" if resume == "auto" else Path(resume)
    if (root / TAG).is_dir():
        return root
    if (root / "checkpoints" / LATEST).is_file():
        root = root / "checkpoints"
    latest = root / LATEST
    if not latest.is_file():
        if resume == "auto":
            return None
        raise ConfigError(f"trainer.resume={resume!r}: no checkpoint there (neither a 'state' folder nor a 'latest' file)")
    path = root / json.loads(latest.read_text())["path"]
    if not (path / TAG).is_dir():
        raise ConfigError(f"trainer.resume={resume!r}: {latest} names {path.name}, which is missing or incomplete")
    return path


def load(engine, path: Path) -> dict:
    """Restore the engine (model, optimizer, LR schedule) and this rank's RNG states; return the client state."""
    # DeepSpeed's own errors for these mismatches are far from one line (its universal checkpoint converts)
    meta = json.loads((path / META).read_text()) if (path / META).is_file() else {}
    if meta.get("world_size", dist.world_size()) != dist.world_size():
        raise ConfigError(f"checkpoint {path} was written by {meta['world_size']} process(es); resume it with "
                          f"{meta['world_size']}, not {dist.world_size()}")
    stage = engine.zero_optimization_stage()
    if meta.get("zero_stage", stage) != stage:
        raise ConfigError(f"checkpoint {path} was written under ZeRO stage {meta['zero_stage']}; resume it with "
                          f"deepspeed.stage={meta['zero_stage']}, not {stage}")
    load_path, client_state = engine.load_checkpoint(str(path), tag=TAG, load_optimizer_states=True,
                                                     load_lr_scheduler_states=True)
    if load_path is None:
        raise ConfigError(f"checkpoint {path}: DeepSpeed could not load it (see its log above)")
    rng_file = path / f"rng_rank{dist.rank()}.pt"
    if rng_file.is_file():
        set_rng_state(torch.load(rng_file, weights_only=False))
    return client_state or {}


def trim_metrics(path: Path, last_step: int) -> None:
    """Drop records after `last_step` (-1: all) from a metrics.jsonl, so a run resumed from an older checkpoint
    (or restarted) does not log those steps twice. Rank 0 only."""
    if not dist.is_main() or not path.is_file():
        return
    lines = path.read_text().splitlines(keepends=True)
    kept = [line for line in lines if _record_step(line) is not None and _record_step(line) <= last_step]
    if len(kept) != len(lines):
        _replace_text(path, "".join(kept))


def _record_step(line: str) -> int | None:
    """The step of a metrics line; None for a line cut short by a killed process."""
    try:
        return int(json.loads(line)["step"])
    except (ValueError, KeyError, TypeError):
        return None

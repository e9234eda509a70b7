"""Resumable checkpoints: model, optimizer, LR scheduler, data position, RNG states of every rank, step, W&B id.

A checkpoint is written into a hidden temporary folder and renamed into place only after every rank
finished writing, then `latest` is replaced atomically: an interrupted save never becomes the one resumed from.
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

TAG = "state"


def _barrier() -> None:
    if dist.world_size() > 1:
        torch_dist.barrier()


def rng_state() -> dict:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def save(engine, root: Path, step: int, client_state: dict, keep_last: int) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step:06d}"
    tmp = root / f".tmp-step_{step:06d}"
    if dist.is_main() and tmp.exists():
        shutil.rmtree(tmp)
    _barrier()
    engine.save_checkpoint(str(tmp), tag=TAG, client_state=client_state, save_latest=False)
    torch.save(rng_state(), tmp / f"rng_rank{dist.rank()}.pt")
    _barrier()
    if dist.is_main():
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        pointer = root / ".latest.tmp"
        pointer.write_text(json.dumps({"step": step, "path": final.name}))
        os.replace(pointer, root / "latest")
        for old in sorted(root.glob("step_*"))[:-keep_last]:
            shutil.rmtree(old)
    _barrier()
    return final


def find_resume_dir(resume: str, run_dir: Path) -> Path | None:
    """`auto`: the latest checkpoint of this run dir; `none`; or a checkpoint folder / run dir path."""
    if resume == "none":
        return None
    root = run_dir / "checkpoints" if resume == "auto" else Path(resume)
    if (root / TAG).is_dir():
        return root
    if (root / "checkpoints" / "latest").is_file():
        root = root / "checkpoints"
    latest = root / "latest"
    if not latest.is_file():
        if resume == "auto":
            return None
        raise FileNotFoundError(f"trainer.resume={resume!r}: no checkpoint found there (no 'latest' file)")
    return root / json.loads(latest.read_text())["path"]


def load(engine, path: Path) -> dict:
    _, client_state = engine.load_checkpoint(str(path), tag=TAG, load_optimizer_states=True,
                                             load_lr_scheduler_states=True)
    rng_file = path / f"rng_rank{dist.rank()}.pt"
    if rng_file.is_file():
        set_rng_state(torch.load(rng_file, weights_only=False))
    return client_state or {}

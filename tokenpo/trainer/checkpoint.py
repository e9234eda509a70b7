"""Resumable checkpoints: model (a LoRA run: its adapters only), optimizer, data position (the learning rate follows from the step), RNG states of every rank, step, W&B id.

Layout under `<run_dir>/checkpoints/`: `step_000004/` (DeepSpeed's `state/` folder, `rng_rank<r>.pt` per rank,
`tokenpo.json` with the step and number of processes, `manifest.json` with the crc32 and size of every other
file, each checksummed by the rank that wrote it) and `latest` (JSON naming the newest complete one).
A checkpoint is written into a hidden temporary folder, its manifest last, and renamed into place only after every
rank finished writing, then `latest` is replaced atomically: an interrupted save never becomes the one resumed from.
Resuming verifies the manifest first: `resume=auto` takes the newest checkpoint that verifies, an explicit path
fails in one line. The RNG files hold tensors and numbers only and are read with `weights_only=True`; DeepSpeed's
own state files are pickles that it loads with `weights_only=False`, so resume only from checkpoints you trust.
Every rank writes its own shards into the same folder, so a multi-node run dir must be on a shared filesystem.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import random
import shutil
from pathlib import Path

import numpy as np
import torch
import torch.distributed as torch_dist

from tokenpo.deepspeed import dist
from tokenpo.errors import ConfigError
from tokenpo.progress import folder_progress
from tokenpo.trainer.checkpoint_layout import (
    LATEST,
    META,
    MANIFEST,
    TAG,
    TMP_PREFIX,
    CheckpointError,
    Ranks,
    check_lora,
    file_records,
    previous_state_bytes,
    read_json,
    replace_text,
    resume_dir_on_disk,
    step_dirs,
    step_of,
)
from tokenpo.trainer.rundir import move_aside

log = logging.getLogger("tokenpo")

# RNG files written before they held tensors only keep numpy's key as an ndarray: allow exactly those types
NUMPY_ARRAY_TYPES = [np.ndarray, np.dtype, np.dtypes.UInt32DType, np._core.multiarray._reconstruct]


def process_ranks() -> Ranks:
    """This process group, to save or verify a checkpoint together (each rank checksums the files it wrote)."""
    return Ranks(dist.rank(), dist.world_size(), dist.all_gather_objects)


def _barrier() -> None:
    if dist.world_size() > 1:
        torch_dist.barrier()


def rng_state() -> dict:
    """Tensors, strings and numbers only, so that `torch.load(weights_only=True)` reads it back."""
    name, key, pos, has_gauss, gauss = np.random.get_state()
    numpy_state = (name, torch.from_numpy(key.astype(np.int64)), pos, has_gauss, gauss)
    state = {"python": random.getstate(), "numpy": numpy_state, "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    name, key, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((name, np.asarray(key, dtype=np.uint32), pos, has_gauss, gauss))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def save(engine, root: Path, step: int, client_state: dict, keep_last: int, lora: dict | None = None,
         with_checksums: bool = True) -> Path:
    """Write checkpoint `step` on every rank (a collective); keep it and the newest `keep_last` - 1 earlier ones.

    `lora`: the run's LoRA settings (LoraConfig.settings()); recorded in tokenpo.json, and the frozen base weights
    are left out (the adapters, their optimizer state and the client state are saved; the base is the model's own).
    `with_checksums` (trainer.verify_checkpoints=full): the manifest records checksums, not sizes alone.
    """
    final = root / f"step_{step:06d}"
    tmp = root / f"{TMP_PREFIX}step_{step:06d}"
    if dist.is_main():
        root.mkdir(parents=True, exist_ok=True)
        # leftovers of saves that were killed midway
        for stale in root.glob(f"{TMP_PREFIX}step_*"):
            shutil.rmtree(stale)
    _barrier()
    frozen = {"exclude_frozen_parameters": True} if lora else {}
    # the bar is rank 0's: only it reads the previous checkpoint's manifest to size it
    with folder_progress(tmp / TAG, total=previous_state_bytes(root) if dist.is_main() else None,
                         desc=f"saving checkpoint step {step}", enabled=dist.is_main()):
        engine.save_checkpoint(str(tmp), tag=TAG, client_state=client_state, save_latest=False, **frozen)
    torch.save(rng_state(), tmp / f"rng_rank{dist.rank()}.pt")
    _barrier()
    if dist.is_main():
        meta = {"step": step, "world_size": dist.world_size(), "zero_stage": engine.zero_optimization_stage()}
        if lora:
            meta["lora"] = lora
        (tmp / META).write_text(json.dumps(meta))
    records = file_records(tmp, process_ranks(), with_checksums)
    if dist.is_main():
        # last: a folder with a manifest holds every file it lists
        (tmp / MANIFEST).write_text(json.dumps(records, indent=1))
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        replace_text(root / LATEST, json.dumps({"step": step, "path": final.name}))
        # by step, and never the one just written (later-numbered folders of another history were set aside)
        earlier = [p for p in step_dirs(root) if step_of(p) < step]
        for old in earlier[:max(len(earlier) - (keep_last - 1), 0)]:
            shutil.rmtree(old)
    _barrier()
    return final


def find_resume_dir(resume: str, run_dir: Path, quick: bool = False, with_checksums: bool = True) -> Path | None:
    """`auto`: the newest checkpoint of this run dir that verifies, if any; `none`; or a checkpoint folder / run dir
    path, which must verify. Every rank checksums the files it wrote, all at once; every rank gets rank 0's answer (or
    its error). `quick` (a start-up check; the run looks again in full): no checksums and no log lines; not
    `with_checksums` (trainer.verify_checkpoints=sizes): presence and sizes only."""
    try:
        answer = resume_dir_on_disk(resume, run_dir, quick, process_ranks(), with_checksums)
    except ConfigError as err:
        answer = err
    answer = dist.broadcast_object(answer)
    if isinstance(answer, ConfigError):
        raise answer
    return answer


def set_aside_stale(root: Path, resume_dir: Path | None) -> None:
    """Move the checkpoints under `root` that this run does not continue (all of them on a fresh start or a resume
    from elsewhere, the later ones on a resume from an earlier one there) into `checkpoints.previous-<time>/`.
    Otherwise they would outrank the new ones: pruning would delete what the run just wrote, resume=auto pick them."""
    if not dist.is_main():
        return
    here = resume_dir is not None and resume_dir.parent.resolve() == root.resolve()
    continued = step_of(resume_dir) if here else -1
    stale = [p for p in step_dirs(root) if step_of(p) > continued]
    if not stale:
        return
    folder = move_aside(stale, root)
    # the next save rewrites it; until then it names the checkpoint continued, or none
    if here:
        replace_text(root / LATEST, json.dumps({"step": continued, "path": resume_dir.name}))
    elif (root / LATEST).is_file():
        os.replace(root / LATEST, folder / LATEST)
    log.warning("moved %d checkpoint(s) this run does not continue (%s) to %s", len(stale),
                ", ".join(p.name for p in stale), folder)


def load(engine, path: Path, lora: dict | None = None) -> dict:
    """Restore the engine (model, optimizer) and this rank's RNG states; return the client state. `lora`: this
    run's LoRA settings, which must be the checkpoint's (a LoRA checkpoint holds no base weights)."""
    # DeepSpeed's own errors for these mismatches are far from one line (its universal checkpoint converts)
    meta = read_json(path / META) if (path / META).is_file() else {}
    if meta.get("world_size", dist.world_size()) != dist.world_size():
        raise ConfigError(f"checkpoint {path} was written by {meta['world_size']} process(es); resume it with "
                          f"{meta['world_size']}, not {dist.world_size()}")
    stage = engine.zero_optimization_stage()
    if meta.get("zero_stage", stage) != stage:
        raise ConfigError(f"checkpoint {path} was written under ZeRO stage {meta['zero_stage']}; resume it with "
                          f"deepspeed.stage={meta['zero_stage']}, not {stage}")
    check_lora(path, lora)
    # read before DeepSpeed unpickles anything, so that a refused file stops the load early
    rng = _load_rng(path / f"rng_rank{dist.rank()}.pt")
    # no LR scheduler state: the learning rate follows from the rollout step (tokenpo.trainer.optim)
    frozen = {"load_module_strict": False} if lora else {}  # the saved module state lacks the frozen base
    load_path, client_state = engine.load_checkpoint(str(path), tag=TAG, load_optimizer_states=True,
                                                     load_lr_scheduler_states=False, **frozen)
    if load_path is None:
        raise ConfigError(f"checkpoint {path}: DeepSpeed could not load it (see its log above)")
    set_rng_state(rng)
    return client_state or {}


def _load_rng(path: Path) -> dict:
    """This rank's RNG states, read as tensors and numbers only: a pickled object in the file is refused, not run."""
    if not path.is_file():
        raise CheckpointError(f"{path}: missing")
    try:
        with torch.serialization.safe_globals(NUMPY_ARRAY_TYPES):
            return torch.load(path, weights_only=True)
    except pickle.UnpicklingError:
        raise CheckpointError(f"{path}: holds objects other than tensors and numbers (refused, not run)") from None
    except (RuntimeError, EOFError, OSError, ValueError) as err:
        reason = str(err).strip().splitlines()[:1]
        raise CheckpointError(f"{path}: unreadable ({type(err).__name__}: {''.join(reason)})") from None


def trim_metrics(path: Path, last_step: int) -> None:
    """Drop records after `last_step` (-1: all) from a metrics.jsonl, so a run resumed from an older checkpoint
    (or restarted) does not log those steps twice. Rank 0 only."""
    if not dist.is_main() or not path.is_file():
        return
    lines = path.read_text().splitlines(keepends=True)
    kept = [line for line in lines if _record_step(line) is not None and _record_step(line) <= last_step]
    if len(kept) != len(lines):
        replace_text(path, "".join(kept))


def _record_step(line: str) -> int | None:
    """The step of a metrics line; None for a line cut short by a killed process."""
    try:
        return int(json.loads(line)["step"])
    except (ValueError, KeyError, TypeError):
        return None

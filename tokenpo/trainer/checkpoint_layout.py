"""Checkpoint folders on disk: their layout, the manifest check, and which one a run resumes from.

No torch here: the start-up check (tokenpo.preflight) finds and verifies the checkpoint to resume before torch is
imported; tokenpo.trainer.checkpoint saves and loads them. The layout is described there.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tokenpo.errors import ConfigError
from tokenpo.progress import progress

log = logging.getLogger("tokenpo")

TAG = "state"
META = "tokenpo.json"
MANIFEST = "manifest.json"
LATEST = "latest"
TMP_PREFIX = ".tmp-"
STEP_DIR = re.compile(r"step_(\d+)")

# files hashed at once (hashlib releases the GIL on large reads)
HASH_THREADS = 8


class CheckpointError(ConfigError):
    """A checkpoint cannot be resumed from; the one-line message names the file and what is wrong with it."""


def replace_text(path: Path, text: str) -> None:
    """Write `text` to `path` atomically (a reader sees the old or the new content, never a mix)."""
    tmp = path.with_name(f"{TMP_PREFIX}{path.name}")
    tmp.write_text(text)
    os.replace(tmp, path)


def step_dirs(root: Path) -> list[Path]:
    """The checkpoint folders under `root`, oldest step first (by number: names sort wrongly past 999999)."""
    return sorted((p for p in root.glob("step_*") if STEP_DIR.fullmatch(p.name) and p.is_dir()), key=step_of)


def step_of(path: Path) -> int:
    return int(STEP_DIR.fullmatch(path.name).group(1))


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 24):
            digest.update(chunk)
    return digest.hexdigest()


def hashed(paths: list[Path], what: str) -> list[str]:
    """The sha256 of each file, HASH_THREADS at a time; on a terminal a bar of the bytes hashed (minutes for a large
    checkpoint)."""
    bar = progress(total=sum(p.stat().st_size for p in paths), desc=what, unit="B", unit_scale=True,
                   unit_divisor=1024)

    def one(path: Path) -> str:
        digest = file_sha256(path)
        bar.update(path.stat().st_size)
        return digest

    with bar, ThreadPoolExecutor(HASH_THREADS) as pool:
        return list(pool.map(one, paths))


def file_records(folder: Path) -> dict[str, dict]:
    """{path relative to `folder`: {"bytes", "sha256"}} for every file in it but the manifest."""
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST)
    digests = hashed(files, f"checksums of {folder.name}")
    return {str(p.relative_to(folder)): {"bytes": p.stat().st_size, "sha256": d} for p, d in zip(files, digests)}


def verify(path: Path, quick: bool = False) -> None:
    """Raise CheckpointError naming the first file of checkpoint `path` that is missing, truncated or changed since
    it was saved (`quick`: missing or resized only, no hashing). A checkpoint written before manifests existed is
    accepted with a warning."""
    manifest = path / MANIFEST
    if not manifest.is_file():
        if not (path / TAG).is_dir():
            raise CheckpointError(f"checkpoint {path}: no '{TAG}' folder and no {MANIFEST} (incomplete)")
        if not quick:
            log.warning("checkpoint %s has no %s (saved before checksums were recorded): loading it unverified",
                        path, MANIFEST)
        return
    try:
        expected = {name: (int(record["bytes"]), str(record["sha256"]))
                    for name, record in json.loads(manifest.read_text()).items()}
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        raise CheckpointError(f"{manifest}: unreadable ({type(err).__name__}: {err})") from None
    for name, (size, _) in expected.items():
        file = path / name
        if not file.is_file():
            raise CheckpointError(f"{file}: missing (listed in {MANIFEST})")
        if file.stat().st_size != size:
            raise CheckpointError(f"{file}: {file.stat().st_size} bytes, {size} when saved (truncated or overwritten)")
    if quick:
        return
    digests = dict(zip(expected, hashed([path / name for name in expected], f"verifying {path.name}")))
    for name, (_, sha256) in expected.items():
        if digests[name] != sha256:
            raise CheckpointError(f"{path / name}: sha256 differs from the one recorded when saved (corrupted)")


def newest_verified(root: Path, quick: bool) -> Path | None:
    """The newest checkpoint under `root` that verifies; one warning line for those skipped and a lost `latest`."""
    notes = []
    for path in reversed(step_dirs(root)):
        try:
            verify(path, quick)
        except CheckpointError as err:
            notes.append(f"skipped {err}")
            continue
        try:
            latest = latest_target(root, "auto")
            if latest != path and not notes:
                notes.append(f"{root / LATEST} names {latest.name}")
        except CheckpointError as err:
            notes.append(str(err))
        if notes and not quick:
            log.warning("trainer.resume=auto: %s; resuming from %s", "; ".join(notes), path)
        return path
    if notes:
        raise CheckpointError(f"trainer.resume=auto: no checkpoint in {root} verifies ({'; '.join(notes)}); "
                              f"trainer.resume=none starts over and moves them aside")
    return None


def verified_at(path: Path, quick: bool) -> Path:
    """trainer.resume=<path>: a checkpoint folder, or the one `latest` names in a run dir or its checkpoints folder."""
    if not (path / TAG).is_dir() and not (path / MANIFEST).is_file():
        root = path / "checkpoints" if (path / "checkpoints").is_dir() else path
        if not (root / LATEST).is_file():
            raise ConfigError(f"trainer.resume={str(path)!r}: no checkpoint there (neither a '{TAG}' folder nor a "
                              f"'{LATEST}' file)")
        path = latest_target(root, str(path))
    verify(path, quick)
    return path


def latest_target(root: Path, resume: str) -> Path:
    latest = root / LATEST
    if not latest.is_file():
        raise CheckpointError(f"{latest} is missing")
    try:
        name = json.loads(latest.read_text())["path"]
    except (ValueError, KeyError, TypeError) as err:
        raise CheckpointError(f"{latest}: unreadable ({type(err).__name__}: {err})") from None
    path = root / str(name)
    if not (path / TAG).is_dir():
        raise CheckpointError(f"trainer.resume={resume!r}: {latest} names {path.name}, which is missing or incomplete")
    return path


def check_lora(path: Path, lora: dict | None) -> None:
    """The checkpoint at `path` was trained with the LoRA settings `lora` (None: full fine-tuning; checkpoints from
    before LoRA existed are full fine-tuning); one line naming the keys that differ otherwise."""
    meta = read_json(path / META) if (path / META).is_file() else {}
    saved = meta.get("lora")
    if saved == lora:
        return
    if saved is None or lora is None:
        what = "full fine-tuning" if saved is None else f"LoRA rank {saved['rank']}"
        raise ConfigError(f"checkpoint {path} was trained with {what}: resume it with "
                          + ("model.lora.rank=0" if saved is None else f"model.lora.rank={saved['rank']}")
                          + " (model.lora settings must match the checkpoint's)")
    diffs = ", ".join(f"model.lora.{k}={saved.get(k)!r} (not {lora.get(k)!r})" for k in sorted(set(saved) | set(lora))
                      if saved.get(k) != lora.get(k))
    raise ConfigError(f"checkpoint {path} was trained with other LoRA settings: resume it with {diffs}")


def previous_state_bytes(root: Path) -> int | None:
    """Bytes of DeepSpeed's state in the newest checkpoint under `root` by its manifest, the size the next save of the
    same run will have (None without one, or with an unreadable manifest: it only sizes a progress bar)."""
    newest = step_dirs(root)[-1:]
    try:
        records = read_json(newest[0] / MANIFEST) if newest else {}
        return sum(r["bytes"] for name, r in records.items() if name.startswith(f"{TAG}/")) or None
    except (OSError, CheckpointError, KeyError, TypeError, AttributeError):
        return None


def read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except ValueError as err:
        raise CheckpointError(f"{path}: not JSON ({err})") from None


def resume_dir_on_disk(resume: str, run_dir: Path, quick: bool = False) -> Path | None:
    """The checkpoint trainer.resume names (see tokenpo.trainer.checkpoint.find_resume_dir), read by this process
    alone; `quick`: no hashing and no log lines."""
    if resume == "none":
        return None
    if resume == "auto":
        return newest_verified(run_dir / "checkpoints", quick)
    return verified_at(Path(resume), quick)

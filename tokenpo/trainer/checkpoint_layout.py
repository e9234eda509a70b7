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
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
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

# files checksummed at once by each process (zlib.crc32 and hashlib release the GIL on large buffers)
HASH_THREADS = 8
# bytes read at a time, into one reused buffer per file
CHUNK = 1 << 24
# DeepSpeed's per-rank shards (zero_pp_rank_<r>_...: optimizer states under ZeRO 1-3, model states too under ZeRO-3;
# bf16_zero_pp_rank_<r>_... with a bf16 optimizer) and tokenpo's rng_rank<r>.pt name the rank that wrote them
RANK_IN_NAME = re.compile(r"(?:zero_pp_rank_|rng_rank)(\d+)")


class CheckpointError(ConfigError):
    """A checkpoint cannot be resumed from; the one-line message names the file and what is wrong with it."""


class Crc32:
    """zlib.crc32 behind hashlib's update/hexdigest."""

    def __init__(self):
        self.value = 0

    def update(self, chunk) -> None:
        self.value = zlib.crc32(chunk, self.value)

    def hexdigest(self) -> str:
        return f"{self.value:08x}"


# The checksum a file's manifest record names by its key. New manifests use crc32 (issue 27): 1.7-3x sha256's speed on
# the build machine (scripts/bench_checksum.py, docs/reliability.md) and in the standard library (xxhash's xxh3, 4x
# crc32's, is no declared dependency: each rank checksumming only its own files is what scales). It catches accidental
# damage, all the manifest is for: whoever can change a file can rewrite the manifest too. sha256: manifests before.
CHECKSUMS: dict[str, Callable] = {"crc32": Crc32, "sha256": hashlib.sha256}
NEW_CHECKSUM = "crc32"


@dataclass(frozen=True)
class FileRecord:
    """A file's entry in manifest.json: its size, which checksum (a key of CHECKSUMS) and its value; None for both
    when saved with trainer.verify_checkpoints=sizes."""
    size: int
    checksum: str | None = None
    digest: str | None = None

    def as_json(self) -> dict:
        return {"bytes": self.size} | ({self.checksum: self.digest} if self.checksum else {})


def alone(obj) -> list:
    return [obj]


@dataclass(frozen=True)
class Ranks:
    """The processes that save or verify a checkpoint together. Each checksums the files it wrote (`owner`), in
    parallel with the others; `gather` pools one small picklable object per rank, in rank order, on every rank
    (tokenpo.deepspeed.dist.all_gather_objects). The default is one process doing it all (the start-up check)."""
    rank: int = 0
    size: int = 1
    gather: Callable[[object], list] = alone

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def from_main(self, obj):
        """Rank 0's `obj` on every rank (what rank 0 sees on a shared filesystem decides, so ranks never diverge)."""
        return self.gather(obj)[0]

    def first_problem(self, problem: str | None) -> str | None:
        """The first rank's problem, in rank order, on every rank; None when no rank has one."""
        return next((p for p in self.gather(problem) if p), None)


LONE = Ranks()


def owner(name: str, world_size: int) -> int:
    """The rank that checksums checkpoint file `name` (a path relative to the checkpoint): the one that wrote it,
    named in it (RANK_IN_NAME); the rest (model states under ZeRO 0-2, tokenpo.json) rank 0 wrote. So a rank reads
    what is in its own page cache, on its own node, and rank 0 no longer reads every byte (issue 27)."""
    match = RANK_IN_NAME.search(Path(name).name)
    return int(match.group(1)) % world_size if match else 0


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


def file_checksum(path: Path, checksum: str) -> str:
    digest, buffer = CHECKSUMS[checksum](), memoryview(bytearray(CHUNK))
    with path.open("rb", buffering=0) as f:
        while size := f.readinto(buffer):
            digest.update(buffer[:size])
    return digest.hexdigest()


def checksums(files: dict[Path, str], what: str, bar: bool) -> dict[Path, str]:
    """{path: its checksum} for `files` ({path: which checksum}), HASH_THREADS at a time; with `bar`, on a terminal,
    a bar of the bytes read (tens of seconds for a large checkpoint)."""
    progress_bar = progress(total=sum(p.stat().st_size for p in files), desc=what, unit="B", unit_scale=True,
                            unit_divisor=1024, enabled=bar)

    def one(path: Path) -> str:
        digest = file_checksum(path, files[path])
        progress_bar.update(path.stat().st_size)
        return digest

    with progress_bar, ThreadPoolExecutor(HASH_THREADS) as pool:
        return dict(zip(files, pool.map(one, files)))


def file_records(folder: Path, ranks: Ranks = LONE, with_checksums: bool = True) -> dict[str, dict]:
    """The manifest of `folder` on rank 0 ({path relative to it: FileRecord.as_json()} for every file in it but the
    manifest; the other ranks get {}). Every rank checksums the files it wrote while the others do theirs, and rank 0
    merges the records: as torch.distributed.checkpoint saves, where each rank describes its own files and the
    coordinator writes the metadata. Rank 0 lists the folder, so the ranks agree on what is in it. Without
    `with_checksums`, sizes only."""
    names = ranks.from_main(sorted(str(p.relative_to(folder)) for p in folder.rglob("*")
                                   if p.is_file() and p.name != MANIFEST) if ranks.is_main else None)
    mine = {folder / name: NEW_CHECKSUM for name in names if owner(name, ranks.size) == ranks.rank}
    checksum = NEW_CHECKSUM if with_checksums else None
    digests = checksums(mine, f"checksums of {folder.name}", bar=ranks.is_main) if checksum else dict.fromkeys(mine)
    records = {str(p.relative_to(folder)): FileRecord(p.stat().st_size, checksum, digests[p]).as_json() for p in mine}
    merged = ranks.gather(records)
    return {name: record for part in merged for name, record in sorted(part.items())} if ranks.is_main else {}


def read_records(manifest: Path) -> dict[str, FileRecord]:
    try:
        records = {}
        for name, record in json.loads(manifest.read_text()).items():
            [checksum] = [key for key in CHECKSUMS if key in record] or [None]
            records[name] = FileRecord(int(record["bytes"]), checksum, checksum and str(record[checksum]))
        return records
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        raise CheckpointError(f"{manifest}: unreadable ({type(err).__name__}: {err})") from None


def verify(path: Path, quick: bool = False, ranks: Ranks = LONE, with_checksums: bool = True) -> None:
    """Raise CheckpointError naming the first file of checkpoint `path` that is missing, truncated or changed since
    it was saved (`quick`, or not `with_checksums`: missing or resized only), on every rank of `ranks` (a
    collective: each checksums the files it wrote, see `owner`). `quick` also logs nothing. A checkpoint written
    before manifests existed is accepted with a warning."""
    problem = ranks.first_problem(problem_seen(path, quick, ranks, with_checksums))
    if problem:
        raise CheckpointError(problem)


def problem_seen(path: Path, quick: bool, ranks: Ranks, with_checksums: bool) -> str | None:
    """What is wrong with checkpoint `path` as this rank sees it (sizes of every file, checksums of its own); None
    when nothing is. Never raises: the other ranks wait for this answer."""
    manifest = path / MANIFEST
    try:
        if not manifest.is_file():
            if not (path / TAG).is_dir():
                return f"checkpoint {path}: no '{TAG}' folder and no {MANIFEST} (incomplete)"
            if not quick and ranks.is_main:
                log.warning("checkpoint %s has no %s (saved before checksums were recorded): loading it unverified",
                            path, MANIFEST)
            return None
        records = read_records(manifest)
        for name, record in records.items():
            file = path / name
            if not file.is_file():
                return f"{file}: missing (listed in {MANIFEST})"
            if file.stat().st_size != record.size:
                return f"{file}: {file.stat().st_size} bytes, {record.size} when saved (truncated or overwritten)"
        if quick or not with_checksums:
            return None
        mine = {path / name: r.checksum for name, r in records.items()
                if r.checksum and owner(name, ranks.size) == ranks.rank}
        digests = checksums(mine, f"verifying {path.name}", bar=ranks.is_main)
        for name, record in records.items():
            if path / name in mine and digests[path / name] != record.digest:
                return f"{path / name}: {record.checksum} differs from the one recorded when saved (corrupted)"
        return None
    except CheckpointError as err:
        return str(err)
    except OSError as err:
        return f"{path}: unreadable ({type(err).__name__}: {err})"


def newest_verified(root: Path, quick: bool, ranks: Ranks, with_checksums: bool) -> Path | None:
    """The newest checkpoint under `root` that verifies; one warning line (rank 0's) for those skipped and a lost
    `latest`. The candidates are those rank 0 lists, so every rank verifies the same ones."""
    notes = []
    for name in ranks.from_main([p.name for p in reversed(step_dirs(root))] if ranks.is_main else None):
        path = root / name
        try:
            verify(path, quick, ranks, with_checksums)
        except CheckpointError as err:
            notes.append(f"skipped {err}")
            continue
        try:
            latest = latest_target(root, "auto")
            if latest != path and not notes:
                notes.append(f"{root / LATEST} names {latest.name}")
        except CheckpointError as err:
            notes.append(str(err))
        if notes and not quick and ranks.is_main:
            log.warning("trainer.resume=auto: %s; resuming from %s", "; ".join(notes), path)
        return path
    if notes:
        raise CheckpointError(f"trainer.resume=auto: no checkpoint in {root} verifies ({'; '.join(notes)}); "
                              f"trainer.resume=none starts over and moves them aside")
    return None


def verified_at(path: Path, quick: bool, ranks: Ranks, with_checksums: bool) -> Path:
    """trainer.resume=<path>: a checkpoint folder, or the one `latest` names in a run dir or its checkpoints folder."""
    if not (path / TAG).is_dir() and not (path / MANIFEST).is_file():
        root = path / "checkpoints" if (path / "checkpoints").is_dir() else path
        if not (root / LATEST).is_file():
            raise ConfigError(f"trainer.resume={str(path)!r}: no checkpoint there (neither a '{TAG}' folder nor a "
                              f"'{LATEST}' file)")
        path = latest_target(root, str(path))
    verify(path, quick, ranks, with_checksums)
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


def resume_dir_on_disk(resume: str, run_dir: Path, quick: bool = False, ranks: Ranks = LONE,
                       with_checksums: bool = True) -> Path | None:
    """The checkpoint trainer.resume names (see tokenpo.trainer.checkpoint.find_resume_dir), looked up by `ranks`
    together (a collective when several; each checksums its own files); `quick`: no checksums and no log lines;
    not `with_checksums` (trainer.verify_checkpoints=sizes): no checksums."""
    if resume == "none":
        return None
    if resume == "auto":
        return newest_verified(run_dir / "checkpoints", quick, ranks, with_checksums)
    return verified_at(Path(resume), quick, ranks, with_checksums)

"""A checkpoint's manifest: the size and crc32 of every file in the folder, written last when it is saved and checked
before a resume, each file checksummed by the rank that wrote it. No torch here (the start-up check reads it)."""

from __future__ import annotations

import json
import re
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from tokenpo.errors import ConfigError
from tokenpo.progress import progress

MANIFEST = "manifest.json"
# a record's keys: the file's size and, unless saved with trainer.verify_checkpoints=sizes, its crc32
BYTES, CRC32 = "bytes", "crc32"
# files checksummed at once by each process (zlib.crc32 releases the GIL on large buffers)
HASH_THREADS = 8
# bytes read at a time, into one reused buffer per file
CHUNK = 1 << 24
# DeepSpeed's per-rank shards (zero_pp_rank_<r>_...: optimizer states under ZeRO 1-3, model states too under ZeRO-3;
# bf16_zero_pp_rank_<r>_... with a bf16 optimizer) and tokenpo's rng_rank<r>.pt name the rank that wrote them
RANK_IN_NAME = re.compile(r"(?:zero_pp_rank_|rng_rank)(\d+)")


class CheckpointError(ConfigError):
    """A checkpoint cannot be resumed from; the one-line message names the file and what is wrong with it."""


class Crc32:
    """zlib.crc32 behind hashlib's update/hexdigest. crc32 (issue 27): 1.7-3x sha256's speed on the build machine
    (scripts/bench_checksum.py, docs/reliability.md) and in the standard library. It catches accidental damage, all
    the manifest is for: whoever can change a file can rewrite the manifest too."""

    def __init__(self):
        self.value = 0

    def update(self, chunk) -> None:
        self.value = zlib.crc32(chunk, self.value)

    def hexdigest(self) -> str:
        return f"{self.value:08x}"


@dataclass(frozen=True)
class FileRecord:
    """A file's entry in manifest.json: its size and crc32 (None when saved with trainer.verify_checkpoints=sizes)."""
    size: int
    crc32: str | None = None

    def as_json(self) -> dict:
        return {BYTES: self.size} | ({CRC32: self.crc32} if self.crc32 else {})


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


def file_crc32(path: Path) -> str:
    digest, buffer = Crc32(), memoryview(bytearray(CHUNK))
    with path.open("rb", buffering=0) as f:
        while size := f.readinto(buffer):
            digest.update(buffer[:size])
    return digest.hexdigest()


def crc32s(files: list[Path], what: str, bar: bool) -> dict[Path, str]:
    """{path: its crc32} for `files`, HASH_THREADS at a time; with `bar`, on a terminal, a bar of the bytes read (tens
    of seconds for a large checkpoint)."""
    progress_bar = progress(total=sum(p.stat().st_size for p in files), desc=what, unit="B", unit_scale=True,
                            unit_divisor=1024, enabled=bar)

    def one(path: Path) -> str:
        digest = file_crc32(path)
        progress_bar.update(path.stat().st_size)
        return digest

    with progress_bar, ThreadPoolExecutor(HASH_THREADS) as pool:
        return dict(zip(files, pool.map(one, files)))


def manifest_records(folder: Path, ranks: Ranks = LONE, with_checksums: bool = True) -> dict[str, dict]:
    """The manifest of `folder` on rank 0 ({path relative to it: FileRecord.as_json()} for every file in it but the
    manifest; the other ranks get {}). Every rank checksums the files it wrote while the others do theirs, and rank 0
    merges the records: as torch.distributed.checkpoint saves, where each rank describes its own files and the
    coordinator writes the metadata. Rank 0 lists the folder, so the ranks agree on what is in it. Without
    `with_checksums`, sizes only."""
    names = ranks.from_main(sorted(str(p.relative_to(folder)) for p in folder.rglob("*")
                                   if p.is_file() and p.name != MANIFEST) if ranks.is_main else None)
    mine = [folder / name for name in names if owner(name, ranks.size) == ranks.rank]
    digests = crc32s(mine, f"checksums of {folder.name}", bar=ranks.is_main) if with_checksums else dict.fromkeys(mine)
    records = {str(p.relative_to(folder)): FileRecord(p.stat().st_size, digests[p]).as_json() for p in mine}
    merged = ranks.gather(records)
    return {name: record for part in merged for name, record in sorted(part.items())} if ranks.is_main else {}


def read_records(manifest: Path) -> dict[str, FileRecord]:
    """The records of `manifest`; one line naming the first record that is not {bytes[, crc32]} (a manifest of an
    earlier tokenpo, before crc32, held sha256 records: not resumable by this one)."""
    try:
        raw = json.loads(manifest.read_text())
        records = {name: FileRecord(int(record[BYTES]), record.get(CRC32) and str(record[CRC32]))
                   for name, record in raw.items()}
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        raise CheckpointError(f"{manifest}: unreadable ({type(err).__name__}: {err})") from None
    for name, record in raw.items():
        if not set(record) <= {BYTES, CRC32}:
            raise CheckpointError(f"{manifest}: the record of {name} has {', '.join(sorted(record))}, not {BYTES} and "
                                  f"{CRC32} (written by an earlier tokenpo: not resumable by this one)")
    return records


def verify_manifest(path: Path, quick: bool = False, ranks: Ranks = LONE, with_checksums: bool = True) -> None:
    """Raise CheckpointError naming the first file of checkpoint `path` that is missing, truncated or changed since
    it was saved (`quick`, or not `with_checksums`: missing or resized only), on every rank of `ranks` (a
    collective: each checksums the files it wrote, see `owner`)."""
    problem = ranks.first_problem(problem_seen(path, quick, ranks, with_checksums))
    if problem:
        raise CheckpointError(problem)


def problem_seen(path: Path, quick: bool, ranks: Ranks, with_checksums: bool) -> str | None:
    """What is wrong with checkpoint `path` as this rank sees it (sizes of every file, checksums of its own); None
    when nothing is. Never raises: the other ranks wait for this answer."""
    manifest = path / MANIFEST
    try:
        if not manifest.is_file():
            return f"checkpoint {path}: no {MANIFEST} (an incomplete save, or a checkpoint of an earlier tokenpo)"
        records = read_records(manifest)
        for name, record in records.items():
            file = path / name
            if not file.is_file():
                return f"{file}: missing (listed in {MANIFEST})"
            if file.stat().st_size != record.size:
                return f"{file}: {file.stat().st_size} bytes, {record.size} when saved (truncated or overwritten)"
        if quick or not with_checksums:
            return None
        mine = [path / name for name, r in records.items() if r.crc32 and owner(name, ranks.size) == ranks.rank]
        digests = crc32s(mine, f"verifying {path.name}", bar=ranks.is_main)
        for name, record in records.items():
            if path / name in digests and digests[path / name] != record.crc32:
                return f"{path / name}: {CRC32} differs from the one recorded when saved (corrupted)"
        return None
    except CheckpointError as err:
        return str(err)
    except OSError as err:
        return f"{path}: unreadable ({type(err).__name__}: {err})"


def recorded_bytes(folder: Path, prefix: str) -> int | None:
    """Bytes of the files under `prefix` in `folder` by its manifest (None without one, or with an unreadable one)."""
    try:
        return sum(r.size for name, r in read_records(folder / MANIFEST).items() if name.startswith(prefix)) or None
    except (OSError, CheckpointError):
        return None

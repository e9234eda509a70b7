"""Which steps an offline W&B run holds on disk: read back from its transaction logs (`run-<id>.wandb`).

Needed on resume: an offline run cannot ask a server what it holds, and a killed process loses the steps that
W&B had not yet written. The file is a LevelDB-style log (32 KiB blocks of records, each a 7-byte header:
CRC32C, length, type) after a 7-byte W&B header; a record is a protobuf `Record` of W&B's own schema. A record
cut short by the kill ends the read.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path

# the file's header (":W&B", magic, version) and each record's (checksum, length, type)
FILE_HEADER = 7
RECORD_HEADER = 7
BLOCK = 32 * 1024
# record types: a whole record, or the first / a middle / the last piece of one that spans blocks
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: Path) -> Iterator[bytes]:
    """The serialized records of a `.wandb` file, in order, up to the first incomplete one."""
    data = path.read_bytes()
    pos, pieces = FILE_HEADER, []
    while True:
        left_in_block = BLOCK - pos % BLOCK
        if left_in_block < RECORD_HEADER:
            # too small for a header: the writer padded the block with zeros
            pos += left_in_block
            continue
        if pos + RECORD_HEADER > len(data):
            return
        length, kind = struct.unpack_from("<HB", data, pos + 4)
        end = pos + RECORD_HEADER + length
        if kind not in (FULL, FIRST, MIDDLE, LAST) or end > len(data):
            return
        piece = data[pos + RECORD_HEADER:end]
        pos = end
        pieces = [piece] if kind in (FULL, FIRST) else [*pieces, piece]
        if kind in (FULL, LAST):
            yield b"".join(pieces)


def history_steps(path: Path) -> set[int]:
    """The steps of the history rows in one `.wandb` file."""
    from wandb.proto import wandb_internal_pb2

    steps = set()
    for raw in records(path):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(raw)
        if record.WhichOneof("record_type") == "history":
            steps.add(record.history.step.num)
    return steps


def offline_steps(wandb_dir: Path, run_id: str) -> set[int]:
    """Steps held by every offline attempt of run `run_id` under `wandb_dir` (`offline-run-<time>-<id>/`)."""
    files = wandb_dir.glob(f"offline-run-*-{run_id}/run-{run_id}.wandb")
    return set().union(*map(history_steps, files))

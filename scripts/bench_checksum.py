"""Bytes per second of each checksum candidate for checkpoint manifests (issue 27 item 3), on one file.

    .venv/bin/python scripts/bench_checksum.py [--gb 1] [--repeats 3] [--dir /tmp]

Writes a file of --gb GiB of random bytes, reads it once to have it in the page cache (a checkpoint just
written is there too), then times, --repeats times each: a plain read (the floor any checksum pays), sha256,
blake2b, zlib.crc32 and, where installed, xxhash's xxh3_64, each over the same 16 MiB reads into one reused
buffer as tokenpo.trainer.harness.checkpoint_manifest. Prints one line per candidate: median MB/s (10^6 bytes) of the wall
clock and of the process's CPU time (user + system, which other jobs on a shared machine inflate less), min-max, n.
One thread: a rank checksums its files next to the other ranks' processes, each on its own core.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tokenpo.trainer.harness.checkpoint_manifest import CHUNK, Crc32


class NoHash:
    """Reading alone: what every candidate pays before it hashes."""

    def update(self, chunk: bytes) -> None:
        pass

    def hexdigest(self) -> str:
        return ""


def candidates() -> dict[str, Callable]:
    found = {"read only": NoHash, "sha256": hashlib.sha256, "blake2b": hashlib.blake2b, "crc32 (zlib)": Crc32}
    try:
        import xxhash

        found["xxh3_64 (xxhash)"] = xxhash.xxh3_64
    except ImportError:
        pass
    return found


@dataclass(frozen=True)
class Timing:
    wall_s: float
    cpu_s: float


def time_to_hash(path: Path, make: Callable) -> Timing:
    digest, buffer = make(), memoryview(bytearray(CHUNK))
    wall, cpu = time.perf_counter(), time.process_time()
    with path.open("rb", buffering=0) as f:
        while size := f.readinto(buffer):
            digest.update(buffer[:size])
    digest.hexdigest()
    return Timing(time.perf_counter() - wall, time.process_time() - cpu)


def rates(size: int, seconds: list[float]) -> str:
    mb_s = [size / s / 1e6 for s in seconds]
    return f"{statistics.median(mb_s):6.0f} MB/s (min {min(mb_s):.0f}, max {max(mb_s):.0f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gb", type=float, default=1.0, help="file size in GiB")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dir", default=tempfile.gettempdir(), help="where the test file is written")
    args = parser.parse_args()
    size = int(args.gb * (1 << 30))
    with tempfile.NamedTemporaryFile(dir=args.dir, suffix=".bin") as tmp:
        path = Path(tmp.name)
        with path.open("wb") as f:
            for _ in range(0, size, CHUNK):
                f.write(os.urandom(min(CHUNK, size - f.tell())))
        time_to_hash(path, NoHash)  # into the page cache
        print(f"{size / 1e9:.2f} GB file in {args.dir}, page-cached, 16 MiB reads, one thread, n={args.repeats}, "
              f"median (min, max)")
        for name, make in candidates().items():
            timings = [time_to_hash(path, make) for _ in range(args.repeats)]
            print(f"{name:18s} wall {rates(size, [t.wall_s for t in timings])}   "
                  f"cpu {rates(size, [t.cpu_s for t in timings])}")


if __name__ == "__main__":
    main()

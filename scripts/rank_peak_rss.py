"""Peak resident memory of each rank of a training run: `python scripts/rank_peak_rss.py <tokenpo.train overrides>`.

Runs `python -m tokenpo.train <overrides>` and polls its processes' VmHWM (the kernel's high-water mark of resident
memory, /proc/<pid>/status) until it exits; prints one line per rank (processes with RANK in their environment).
"""

from __future__ import annotations

import subprocess
import sys
import time

import psutil


def high_water_mib(proc: psutil.Process) -> float:
    """The process's peak resident set so far, in MiB."""
    with open(f"/proc/{proc.pid}/status") as status:
        line = next(line for line in status if line.startswith("VmHWM:"))
    return int(line.split()[1]) / 1024


def main(overrides: list[str]) -> int:
    run = subprocess.Popen([sys.executable, "-m", "tokenpo.train", *overrides])
    root, peaks = psutil.Process(run.pid), {}
    while run.poll() is None:
        for proc in root.children(recursive=True):
            try:
                rank = proc.environ().get("RANK")
                if rank is not None:
                    peaks[int(rank)] = max(peaks.get(int(rank), 0.0), high_water_mib(proc))
            except (psutil.Error, OSError, StopIteration):  # a process that just exited or is not ours to read
                pass
        time.sleep(0.2)
    for rank, peak in sorted(peaks.items()):
        print(f"rank {rank}: peak RSS {peak:.0f} MiB")
    return run.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

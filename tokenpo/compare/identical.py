"""Did two runs log the same numbers? Every step's metrics compared exactly, wall-clock entries left out.

    python -m tokenpo.compare.identical RUN_A RUN_B [RUN_C ...]

Each RUN is a run dir (its metrics.jsonl) or a sweep dir (its numbered jobs, paired by number with the other sweep's).
Prints one line per pair: identical (steps and keys compared), or the first step and keys that differ; exit status 1
when any pair differs. How a run was launched (a launcher, a sweep, parallel jobs, a resume) must not change these.
"""

from __future__ import annotations

import sys
from pathlib import Path

from tokenpo.logger.run_logger import read_rows

# metrics that depend on the clock, never equal between runs
CLOCK_PREFIXES = ("timing/", "throughput/", "time/")


def deterministic_rows(run_dir: Path) -> dict[int, dict]:
    """step -> that step's metrics without the clock-dependent ones."""
    return {row["step"]: {k: v for k, v in row.items() if not k.startswith(CLOCK_PREFIXES)}
            for row in read_rows(run_dir / "metrics.jsonl")}


def run_dirs(path: Path) -> dict[str, Path]:
    """A run dir as itself; a sweep dir as its numbered job dirs."""
    if (path / "metrics.jsonl").is_file():
        return {"": path}
    return {job.name: job for job in sorted(path.iterdir(), key=lambda p: p.name) if job.name.isdigit()}


def differences(a: Path, b: Path) -> list[str]:
    """Where the two runs' deterministic metrics differ ('step N: key a != b'); empty when identical."""
    rows_a, rows_b = deterministic_rows(a), deterministic_rows(b)
    if sorted(rows_a) != sorted(rows_b):
        return [f"steps {sorted(rows_a)} != {sorted(rows_b)}"]
    out = []
    for step in sorted(rows_a):
        for key in sorted(set(rows_a[step]) | set(rows_b[step])):
            if rows_a[step].get(key, "absent") != rows_b[step].get(key, "absent"):
                out.append(f"step {step}: {key} {rows_a[step].get(key, 'absent')} != {rows_b[step].get(key, 'absent')}")
    return out


def compare(a: Path, b: Path) -> tuple[bool, str]:
    """(identical, one line saying what was compared or where they differ)."""
    diff = differences(a, b)
    if diff:
        return False, f"DIFFERENT {a} vs {b}: {diff[0]} ({len(diff)} differences)"
    rows = deterministic_rows(a)
    keys = sorted({key for row in rows.values() for key in row} - {"step"})
    return True, f"identical {a} vs {b}: steps {sorted(rows)}, {len(keys)} keys"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) < 2 or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if argv[:1] in (["-h"], ["--help"]) else 2
    first = run_dirs(Path(argv[0]))
    all_same = True
    for other in map(Path, argv[1:]):
        jobs = run_dirs(other)
        if sorted(jobs) != sorted(first):
            print(f"DIFFERENT {argv[0]} vs {other}: jobs {sorted(first)} != {sorted(jobs)}")
            all_same = False
            continue
        for job in sorted(first, key=lambda name: int(name or 0)):
            same, line = compare(first[job], jobs[job])
            print(line)
            all_same &= same
    keys = sorted({key for run in first.values() for row in deterministic_rows(run).values() for key in row} - {"step"})
    print(f"keys compared ({len(keys)}; every metric but {', '.join(p + '*' for p in CLOCK_PREFIXES)}): "
          f"{', '.join(keys)}")
    return 0 if all_same else 1


if __name__ == "__main__":
    sys.exit(main())

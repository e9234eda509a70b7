"""Compare the metrics.jsonl of two run dirs: every step and key whose value differs, clock metrics left out.

    python scripts/compare_metrics.py <run_dir_a> <run_dir_b> [--prefix-ignore timing/ time/ throughput/] [--rtol R]
                                      [--atol A]

Exit status 0 when the runs logged the same steps with identical values (bit for bit: JSON floats compared as
written; with `--rtol` / `--atol`, numbers within that relative or that absolute distance), 1 otherwise. A refactor of the trainer must
leave this at 0 for the same command; two ZeRO stages of one run agree within `--rtol 1e-5` (docs/distributed.md).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

# metrics that depend on the clock, never equal between runs
CLOCK_PREFIXES = ("timing/", "time/", "throughput/")


def read_steps(run_dir: Path) -> dict[int, dict]:
    """metrics.jsonl's records by step."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return {row["step"]: row for row in rows}


def same(left, right, rtol: float, atol: float = 0.0) -> bool:
    """Equal values; numbers within `rtol` of each other relative to the larger magnitude, or within `atol` (both 0:
    bit for bit)."""
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (left, right))
    if not numbers:
        return left == right
    return left == right or abs(left - right) <= max(rtol * max(abs(left), abs(right)), atol)


def differences(a: dict[int, dict], b: dict[int, dict], ignored: tuple[str, ...], rtol: float = 0.0,
                atol: float = 0.0) -> list[str]:
    """One line per step only one run logged, and per (step, key) whose values differ (beyond `rtol` and `atol`) or
    exist in one run only."""
    lines = [f"step {step}: only in {'a' if step in a else 'b'}" for step in sorted(set(a) ^ set(b))]
    for step in sorted(set(a) & set(b)):
        keys = (set(a[step]) | set(b[step])) - {"step"}
        for key in sorted(k for k in keys if not k.startswith(ignored)):
            left, right = a[step].get(key, "<absent>"), b[step].get(key, "<absent>")
            if not same(left, right, rtol, atol):
                lines.append(f"step {step}: {key}: {left!r} != {right!r}")
    return lines


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("a", type=Path)
    parser.add_argument("b", type=Path)
    parser.add_argument("--prefix-ignore", nargs="*", default=list(CLOCK_PREFIXES),
                        help="key prefixes left out (default: the clock's: %(default)s)")
    parser.add_argument("--rtol", type=float, default=0.0,
                        help="numbers equal within this relative tolerance (default 0: bit for bit)")
    parser.add_argument("--atol", type=float, default=0.0,
                        help="numbers equal within this absolute distance (default 0), for values near 0")
    args = parser.parse_args(argv)
    a, b = read_steps(args.a), read_steps(args.b)
    lines = differences(a, b, tuple(args.prefix_ignore), args.rtol, args.atol)
    compared = sum(len(set(a[s]) - {"step"}) for s in set(a) & set(b))
    agree = f"within rtol {args.rtol:g} or atol {args.atol:g}" if args.rtol or args.atol else "identical"
    print("\n".join(lines) if lines else
          f"{agree}: {len(a)} steps, {compared} values (keys starting with {', '.join(args.prefix_ignore)} left out)")
    return 1 if lines else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

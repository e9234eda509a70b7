"""Exact McNemar test between two evaluations of the same problems: did the model's accuracy change?

    python -m tokenpo.compare.mcnemar RUN_A/eval_after.json RUN_B/eval_after.json

Pairs the two files' greedy verdicts by problem uid (the files tokenpo.train and tokenpo.evaluate write), counts
the problems only A got right (b) and only B got right (c), and gives the two-sided exact p = P(|X - n/2| >= |b - n/2|)
for X ~ Binomial(n = b + c, 1/2). One evaluation of each: it tests the two checkpoints on these problems, not the
algorithms that made them (that needs seeds: tokenpo.compare).
"""

from __future__ import annotations

import json
import sys
from math import comb
from pathlib import Path


def greedy_verdicts(path: Path) -> dict[str, bool]:
    records = json.loads(path.read_text())["records"]
    return {record["uid"]: bool(record["greedy_correct"]) for record in records}


def mcnemar_exact_p(only_a: int, only_b: int) -> float:
    """Two-sided exact McNemar p for the discordant counts (1.0 when there are none)."""
    n = only_a + only_b
    if n == 0:
        return 1.0
    tail = sum(comb(n, k) for k in range(min(only_a, only_b) + 1)) / 2**n
    return min(1.0, 2 * tail)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: python -m tokenpo.compare.mcnemar EVAL_A.json EVAL_B.json", file=sys.stderr)
        return 2
    try:
        a, b = (greedy_verdicts(Path(arg)) for arg in argv)
    except (OSError, ValueError, KeyError, TypeError) as err:
        print(f"mcnemar: not an evaluation file with greedy verdicts ({type(err).__name__}: {err})", file=sys.stderr)
        return 1
    if set(a) != set(b):
        print(f"mcnemar: the files hold different problems ({len(set(a) ^ set(b))} uids in one only)", file=sys.stderr)
        return 1
    only_a = sum(a[uid] and not b[uid] for uid in a)
    only_b = sum(b[uid] and not a[uid] for uid in a)
    accuracy_a, accuracy_b = sum(a.values()) / len(a), sum(b.values()) / len(b)
    print(f"n={len(a)} accuracy {accuracy_a:.3f} -> {accuracy_b:.3f} ({accuracy_b - accuracy_a:+.3f}); "
          f"only first right {only_a}, only second right {only_b}; exact McNemar p = {mcnemar_exact_p(only_a, only_b):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What ZeRO-3's parameter gathers cost in tokenpo's passes, on 2 gloo ranks (CPU): per pass, the module fetches, the
all-gathers DeepSpeed launched and the elements they moved, and how often it invalidated its module trace (with no
valid trace it prefetches nothing). Both ranks' counts are printed; they must be equal (tests/deepspeed/
test_collective_parity.py asserts it).

    .venv/bin/python scripts/zero3_gathers.py [--steps 4] [overrides ...]

e.g. `scripts/zero3_gathers.py --steps 4 trainer.logit_chunk_tokens=4 trainer.micro_batch_size=4` (docs/distributed.md
quotes its output).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests"), str(REPO / "tests" / "deepspeed")]

import parity_ranks  # noqa: E402

from support.runs import run_ranks  # noqa: E402


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4, help="updates on the same batch (default %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="the batch's lengths (default %(default)s)")
    parser.add_argument("overrides", nargs="*", help="train config overrides (parity_ranks.py sets ZeRO-3 and the batch)")
    args = parser.parse_args(argv)
    case = {"name": "gathers", "overrides": args.overrides, "seed": args.seed, "steps": args.steps}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        run_ranks(Path(parity_ranks.__file__), [str(out), json.dumps(case)], 2, out / "logs", timeout_s=600)
        ranks = json.loads((out / "gathers.json").read_text())
    print(f"{'pass':<12} {'rank':>4} {'fetches':>8} {'all-gathers':>12} {'elements':>12} {'trace invalidated':>18}")
    for passes in zip(*ranks):
        for rank, record in enumerate(passes):
            print(f"{record['label']:<12} {rank:>4} {len(record['fetches']):>8} {record['all_gathers']:>12} "
                  f"{record['gathered_numel']:>12} {record['invalidations']:>18}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

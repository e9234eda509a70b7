"""Run by every rank of test_algorithm_stages.py: `python algorithm_ranks.py <out_dir> <algorithm>:<stage>:<micro> ...`
(RANK / WORLD_SIZE / MASTER_* set): each algorithm's update on zero_ranks' fixed batch under the stage, split as
zero_ranks.MICRO[micro] says (one group per pass, or packed token budgets), exported to
<out_dir>/<algorithm>/<stage>-<micro>/ with its report beside it."""

from __future__ import annotations

import sys
from pathlib import Path

import zero_ranks

from tokenpo.deepspeed import dist


def main(out: Path, pairs: list[str]) -> None:
    dist.init_distributed("gloo")
    for pair in pairs:
        algorithm, stage, micro = pair.split(":")
        zero_ranks.one_update(stage, micro, out / algorithm, algorithm)


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2:])

"""One worker process of a `trainer.nproc=N` job: `python -m tokenpo.trainer.processes.worker <run_dir>`.

RANK / WORLD_SIZE / MASTER_* come from the environment (tokenpo.trainer.processes.launch sets them). Rank 0 logs to the
console and appends to the run's train.log like a one-process run; the other ranks log warnings only.
A worker dies with the job that started it (`die_with_launcher`).
"""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path

from tokenpo.deepspeed.build_locks import check_build_locks
from tokenpo.errors import ConfigError
from tokenpo.rollout.generator import GeneratorDown
from tokenpo.trainer.harness.identity import RunIdentity
from tokenpo.trainer.processes.launch import die_with_launcher
from tokenpo.trainer.harness.rundir import RESOLVED
from tokenpo.trainer.harness.loop import train

LOG_FORMAT = "[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"


def main(argv: list[str]) -> int:
    # the process's own command: the whole config is built here, as tokenpo.train builds it (tokenpo.config composes
    # every part's schema, this one's included, so the trainer's modules import it for types only)
    from tokenpo.config import build_config

    die_with_launcher()
    run_dir = Path(argv[0])
    payload = json.loads((run_dir / RESOLVED).read_text())
    rank0 = os.environ.get("RANK", "0") == "0"
    handlers = [logging.StreamHandler()] + ([logging.FileHandler(run_dir / "train.log")] if rank0 else [])
    logging.basicConfig(level=logging.INFO if rank0 else logging.WARNING, format=LOG_FORMAT, handlers=handlers)
    # a worker about to wait on a sibling's (or a dead) JIT build says so, before DeepSpeed starts
    check_build_locks(os.environ)
    try:
        identity = RunIdentity(run_dir, payload["name"], payload["group"], payload["config"])
        train(build_config(payload["config"]), identity)
    except ConfigError as err:
        print(f"tokenpo: error: {err}", file=sys.stderr)
        return 2
    except GeneratorDown as err:
        print(f"tokenpo: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

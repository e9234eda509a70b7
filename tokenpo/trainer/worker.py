"""One worker process of a `trainer.nproc=N` job: `python -m tokenpo.trainer.worker <run_dir>`."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

from tokenpo.config import build_config
from tokenpo.errors import ConfigError
from tokenpo.trainer.launch import RESOLVED
from tokenpo.trainer.loop import train


def main(argv: list[str]) -> int:
    run_dir = Path(argv[0])
    payload = json.loads((run_dir / RESOLVED).read_text())
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s][%(name)s][%(levelname)s] - %(message)s")
    try:
        train(build_config(payload["config"]), run_dir, payload["name"], payload["group"], payload["config"])
    except ConfigError as err:
        print(f"tokenpo: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

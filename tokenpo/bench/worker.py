"""One framework's timed run in its own process, so each framework's peak memory is its own.

    python -m tokenpo.bench.worker --framework tokenpo|trl --settings '<BenchSettings JSON>' --out run.json
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch

from tokenpo.bench.settings import BenchSettings
from tokenpo.bench.stats import PeakMemory
from tokenpo.progress import quiet_library_bars

FRAMEWORKS = ("tokenpo", "trl")


def run(framework: str, settings: BenchSettings) -> dict:
    if framework not in FRAMEWORKS:
        raise ValueError(f"unknown framework {framework!r}; known: {', '.join(FRAMEWORKS)}")
    settings.validate()
    torch.set_num_threads(settings.threads)
    load_start = os.getloadavg()
    with PeakMemory() as memory:
        if framework == "tokenpo":
            from tokenpo.bench.run_tokenpo import run_tokenpo

            result = run_tokenpo(settings)
        else:
            from tokenpo.bench.run_trl import run_trl

            result = run_trl(settings)
    result.update(framework=framework, threads_used=torch.get_num_threads(), peak_rss_mb=memory.report(),
                  load_avg={"start": list(load_start), "end": list(os.getloadavg())})
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tokenpo.bench.worker")
    parser.add_argument("--framework", required=True, choices=FRAMEWORKS)
    parser.add_argument("--settings", required=True, help="BenchSettings as JSON")
    parser.add_argument("--out", required=True, help="where the run's JSON goes")
    args = parser.parse_args(argv)
    quiet_library_bars()
    result = run(args.framework, BenchSettings.from_dict(json.loads(args.settings)))
    Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()

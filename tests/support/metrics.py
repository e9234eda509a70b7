"""Reading a run's metrics.jsonl."""

from __future__ import annotations

import json
from pathlib import Path

# metrics that depend on the clock, never equal between runs
CLOCK_PREFIXES = ("timing/", "throughput/", "time/")


def read_metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def by_step(records: list[dict]) -> dict[int, dict]:
    steps = [r["step"] for r in records]
    assert len(steps) == len(set(steps)), f"a step was logged twice: {steps}"
    return {r["step"]: r for r in records}


def deterministic(record: dict) -> dict:
    """A metrics record without its clock-dependent entries."""
    return {k: v for k, v in record.items() if not k.startswith(CLOCK_PREFIXES)}

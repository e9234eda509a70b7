"""The README's comparison examples run each algorithm as itself (issue 42, trap 1): every job of every sweep it shows
composes to a config under which no algorithm setting is inert (tokenpo.algorithms.inert)."""

from __future__ import annotations

import itertools
import re

from support.config import train_config
from support.env import REPO


def readme_sweeps() -> list[list[str]]:
    """The overrides of each `python -m tokenpo.train -m ...` line of the README's code blocks."""
    blocks = re.findall(r"```bash\n(.*?)```", (REPO / "README.md").read_text(), re.S)
    lines = [line.strip() for block in blocks for line in block.splitlines()]
    return [line.split()[4:] for line in lines if line.startswith("python -m tokenpo.train -m ")]


def jobs(overrides: list[str]) -> list[list[str]]:
    """Every job of a sweep: the cartesian product of the comma-separated values."""
    choices = [[f"{key}={value}" for value in values.split(",")]
               for key, values in (override.split("=", 1) for override in overrides)]
    return [list(job) for job in itertools.product(*choices)]


def test_every_job_of_the_readme_s_sweeps_runs_each_algorithm_as_itself():
    sweeps = readme_sweeps()
    assert any(any(o.startswith("algorithm=grpo,dapo") for o in sweep) for sweep in sweeps), sweeps
    for sweep in sweeps:
        for job in jobs(sweep):
            cfg = train_config(*job)
            assert cfg.inert_components() is None, (job, cfg.inert_components())

"""Where the tests live and the environment of the processes they start."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TESTS = REPO / "tests"
# importable in every process a test starts: the helpers (support/), the test reward function
# (trainer_rewards:even_length) and the rank scripts (tests/trainer, tests/deepspeed)
TEST_DIRS = [TESTS, TESTS / "trainer", TESTS / "deepspeed"]
RANK_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def pythonpath() -> str:
    return os.pathsep.join(map(str, [*TEST_DIRS, os.environ.get("PYTHONPATH", "")]))


def cli_env(**extra: str) -> dict[str, str]:
    """Environment for a command-line run: the test dirs importable, no rank variables from this process."""
    env = {k: v for k, v in os.environ.items() if k not in RANK_VARS}
    return dict(env, PYTHONPATH=pythonpath(), **extra)

"""Make tests/rewards/rewards_user_fns.py importable by path, here and in the scorer's worker processes."""

import sys
from pathlib import Path

import pytest


@pytest.fixture(autouse=True, scope="session")
def _user_fns_on_path():
    here = str(Path(__file__).resolve().parent)
    if here not in sys.path:
        sys.path.insert(0, here)

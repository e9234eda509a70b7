"""Fixtures shared by every test folder: the shipped configs as Hydra composes them (support/config.py holds the
helpers, which scripts outside pytest import too)."""

from __future__ import annotations

import sys

import pytest

from support.config import algorithm_dict
from support.env import TEST_DIRS
from tokenpo.algorithms import AlgorithmConfig, algorithm_config_from_dict

# in this process as in the ones the tests start (support.env.pythonpath): in-process runs load the test reward
# (reward.fn=trainer_rewards:even_length) and tests import the rank scripts they launch
for test_dir in map(str, reversed(TEST_DIRS)):
    if test_dir not in sys.path:
        sys.path.insert(0, test_dir)


def _merge(base: dict, overrides: dict) -> dict:
    merged = dict(base)
    for key, value in overrides.items():
        merged[key] = _merge(base[key], value) if isinstance(value, dict) else value
    return merged


@pytest.fixture
def load_algorithm():
    """load_algorithm("dapo", loss={"clip_high": 0.3}) -> the shipped config with overrides."""

    def load(name: str, **overrides) -> AlgorithmConfig:
        return algorithm_config_from_dict(_merge(algorithm_dict(name), overrides))

    return load

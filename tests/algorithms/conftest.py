"""Fixtures for the algorithm tests: the shipped conf/algorithm/*.yaml as Hydra composes them (deltas over grpo)."""

from __future__ import annotations

import copy
import functools
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from tokenpo import CONF_DIR
from tokenpo.algorithms import AlgorithmConfig, algorithm_config_from_dict

ALGORITHM_CONF = Path(CONF_DIR) / "algorithm"
# every shipped config, read from the folder: a new conf/algorithm/<name>.yaml is tested without editing a list
ALGORITHM_NAMES = tuple(sorted(path.stem for path in ALGORITHM_CONF.glob("*.yaml")))


def _merge(base: dict, overrides: dict) -> dict:
    merged = dict(base)
    for key, value in overrides.items():
        merged[key] = _merge(base[key], value) if isinstance(value, dict) else value
    return merged


@functools.lru_cache(maxsize=None)
def composed_algorithm(name: str) -> dict:
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return OmegaConf.to_container(compose(f"algorithm/{name}").algorithm, resolve=True)


def algorithm_dict(name: str) -> dict:
    """conf/algorithm/<name>.yaml with its base's values, as Hydra composes it (a fresh copy: callers may edit it)."""
    return copy.deepcopy(composed_algorithm(name))


@pytest.fixture
def load_algorithm():
    """load_algorithm("dapo", loss={"clip_high": 0.3}) -> the shipped config with overrides."""

    def load(name: str, **overrides) -> AlgorithmConfig:
        return algorithm_config_from_dict(_merge(algorithm_dict(name), overrides))

    return load

"""Fixtures for the algorithm tests: the shipped conf/algorithm/*.yaml as configs."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from tokenpo.algorithms import AlgorithmConfig, algorithm_config_from_dict

CONF_DIR = Path(__file__).resolve().parents[2] / "conf" / "algorithm"
ALGORITHM_NAMES = ("grpo", "dapo", "tepo", "gtpo", "grpo_s", "dr_grpo", "gspo")


def _merge(base: dict, overrides: dict) -> dict:
    merged = dict(base)
    for key, value in overrides.items():
        merged[key] = _merge(base[key], value) if isinstance(value, dict) else value
    return merged


def algorithm_dict(name: str) -> dict:
    return OmegaConf.to_container(OmegaConf.load(CONF_DIR / f"{name}.yaml"), resolve=True)


@pytest.fixture
def load_algorithm():
    """load_algorithm("dapo", loss={"clip_high": 0.3}) -> the shipped config with overrides."""

    def load(name: str, **overrides) -> AlgorithmConfig:
        return algorithm_config_from_dict(_merge(algorithm_dict(name), overrides))

    return load

"""Skywork-OR1 adaptive entropy control (arXiv 2505.22312): the ±Δ rule, its clip, the gate, fixed mode, state."""

from __future__ import annotations

import pytest

from tokenpo.algorithms import needs_entropy_grad
from tokenpo.algorithms.entropy_control import (EntropyCoef, adaptive_entropy_coef, next_entropy_coef,
                                                step_entropy_coef)
from tokenpo.errors import ConfigError
from tokenpo.trainer.harness.state import RunState


def test_up_below_target_down_above_clipped_to_zero_and_c_max():
    assert adaptive_entropy_coef(EntropyCoef(0.002), 0.1, 0.2, 0.001, 0.005) == EntropyCoef(0.003, True)
    assert adaptive_entropy_coef(EntropyCoef(0.002), 0.3, 0.2, 0.001, 0.005) == EntropyCoef(0.001, False)
    assert adaptive_entropy_coef(EntropyCoef(0.0005), 0.3, 0.2, 0.001, 0.005) == EntropyCoef(0.0, False)
    assert adaptive_entropy_coef(EntropyCoef(0.0045), 0.1, 0.2, 0.001, 0.005) == EntropyCoef(0.005, True)
    # the bonus acts only while the entropy is below target
    assert EntropyCoef(0.003, False).value == 0.0 and EntropyCoef(0.003, True).value == 0.003


def test_fixed_mode_reads_the_config_every_step(load_algorithm):
    loss = load_algorithm("grpo", loss={"entropy_coef": 0.01}).loss
    assert step_entropy_coef(loss, EntropyCoef(0.5, False)) == EntropyCoef(0.01)
    assert next_entropy_coef(loss, EntropyCoef(0.01), 0.0) == EntropyCoef(0.01)


def test_adaptive_mode_carries_its_state(load_algorithm):
    loss = load_algorithm("grpo", loss={"entropy_control": "adaptive", "entropy_coef_step": 0.001}).loss
    first = step_entropy_coef(loss, None)
    assert first == EntropyCoef(0.0)
    assert next_entropy_coef(loss, first, 0.1) == EntropyCoef(0.001, True)
    assert next_entropy_coef(loss, first, None) == first
    assert needs_entropy_grad(load_algorithm("grpo", loss={"entropy_control": "adaptive"}))


def test_adaptive_initial_coefficient_must_lie_in_the_clip_range(load_algorithm):
    with pytest.raises(ConfigError, match="entropy_coef must be in"):
        load_algorithm("grpo", loss={"entropy_control": "adaptive", "entropy_coef": 0.1})


def test_state_round_trips_through_the_client_state():
    state = RunState(step=3, sampler={}, entropy_coef=EntropyCoef(0.002, False))
    client = state.to_client_state()
    assert client["entropy_coef"] == {"c": 0.002, "active": False}
    assert RunState.from_client_state(client) == state
    assert RunState.from_client_state({"step": 1, "sampler": {}}).entropy_coef is None

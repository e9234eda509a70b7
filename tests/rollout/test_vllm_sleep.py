"""The vllm engine's own sleep/sync sequence against a stand-in `vllm` module (no vLLM needed): the order of its
calls into vLLM is what a GPU's memory depends on, and vLLM's CPU build has no sleep mode to test it with."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from support import fake_vllm as fake_vllm_module
from support.config import train_config
from tokenpo.models.loading import load_model
from tokenpo.models.published import Published
from tokenpo.rollout.vllm_engine import VLLMEngine


@pytest.fixture
def fake_vllm(monkeypatch) -> list:
    """The stand-in `vllm` module (a GPU with sleep mode); the list its calls go to."""
    return fake_vllm_module.install(monkeypatch)


def engine(*overrides: str) -> tuple[VLLMEngine, torch.nn.Module]:
    """The engine for the tiny model, and the model (its policy)."""
    cfg = train_config("model=tiny", "logger.mode=disabled", "rollout=vllm", *overrides)
    tokenizer, model = load_model(cfg.model, cfg.seed)
    vllm = VLLMEngine(cfg.rollout, tokenizer, Published.of_module(model), torch.device("cpu"))
    vllm.load(Published.of_module(model))  # as the run's start loads the policy's first version
    return vllm, model


def test_level_2_discards_the_weights_and_the_sync_wakes_weights_then_loads_then_wakes_the_kv_cache(fake_vllm):
    vllm, policy = engine()
    weights = len(list(policy.state_dict()))
    assert fake_vllm[0][0] == "LLM" and fake_vllm[0][1]["enable_sleep_mode"] is True
    # built with dummy weights, then loaded (awake: nothing to wake)
    assert fake_vllm[1:] == [("load_weights", weights), ("reset_prefix_cache",)]
    fake_vllm.clear()
    vllm.sleep()
    vllm.sleep()  # asleep already: no second call
    assert fake_vllm == [("sleep", 2)]
    with pytest.raises(RuntimeError, match="discarded its weights"):
        vllm.wake_up()  # sampling after a level-2 sleep without a load would run on garbage weights
    vllm.load(Published.of_module(policy))
    assert fake_vllm == [("sleep", 2),
                         ("empty_cache",), ("wake_up", ["weights"]),
                         ("load_weights", weights), ("reset_prefix_cache",),
                         ("empty_cache",), ("wake_up", ["kv_cache"])]
    fake_vllm.clear()
    vllm.wake_up()  # awake after the load
    vllm.load(Published.of_module(policy))
    assert fake_vllm == [("load_weights", weights), ("reset_prefix_cache",)]


def test_level_1_keeps_the_weights_and_wake_up_takes_everything_back(fake_vllm):
    vllm, _ = engine("rollout.vllm.sleep_level=1")
    fake_vllm.clear()
    vllm.sleep()
    vllm.wake_up()
    assert fake_vllm == [("sleep", 1), ("empty_cache",), ("wake_up", None)]


def test_without_sleep_mode_sleep_and_wake_do_nothing(fake_vllm):
    vllm, policy = engine("rollout.vllm.sleep_mode=false")
    fake_vllm.clear()
    vllm.sleep()
    vllm.wake_up()
    vllm.load(Published.of_module(policy))
    assert [call[0] for call in fake_vllm] == ["load_weights", "reset_prefix_cache"]


def test_sleep_level_is_checked_at_start_up():
    from tokenpo.errors import ConfigError
    from tokenpo.rollout.config import VLLMConfig

    with pytest.raises(ConfigError, match="rollout.vllm.sleep_level must be 1 or 2, got 3"):
        dataclasses.replace(VLLMConfig(), sleep_level=3).validate()


def test_on_a_gpu_the_engine_captures_cuda_graphs_and_leaves_the_kv_cache_to_its_share(fake_vllm):
    engine("rollout.vllm.gpu_memory_utilization=0.55")
    built = fake_vllm[0][1]
    assert (built["gpu_memory_utilization"], built["kv_cache_memory_bytes"], built["enforce_eager"]) == \
        (0.55, None, False)

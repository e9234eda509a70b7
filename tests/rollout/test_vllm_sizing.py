"""vLLM sized for the device it runs on: the CPU values (a 1 GiB KV cache, eager) only on CPU; on CUDA graphs on and
vLLM's share of the device what the memory plan's other parts leave it, which the plan counts."""

from __future__ import annotations

import math

import pytest
import torch

from support import fake_vllm
from support.config import train_config as composed_train_config
from tokenpo.errors import ConfigError
from tokenpo.models.loading import load_model
from tokenpo.plan import memory
from tokenpo.plan import parts as P
from tokenpo.rollout.config import VLLMConfig, VLLMSizing, vllm_sizing
from tokenpo.models.published import Published
from tokenpo.rollout.vllm_engine import VLLMEngine

GIB = 2**30
DEVICE = 80 * GIB
# a 1.5B model in bf16 that fits an 80 GiB device with room for vLLM
RUN = ["model=qwen2_5_math_1_5b", "deepspeed.precision=bf16", "rollout=vllm", "data.max_prompt_tokens=512",
       "rollout.max_new_tokens=1024"]


def train_config(*overrides: str):
    return composed_train_config("logger.mode=disabled", *overrides)


def vllm_part(plan) -> P.Part:
    return next(part for part in plan.parts if part.name == "rollout (vllm)")


def test_nulls_take_the_cpu_values_on_cpu_and_graphs_with_a_planned_cache_on_cuda():
    assert vllm_sizing(VLLMConfig(), "cpu") == VLLMSizing(0.3, GIB, True)
    # on CUDA the KV cache is the rest of vLLM's share (vLLM sizes it), CUDA graphs on
    assert vllm_sizing(VLLMConfig(), "cuda") == VLLMSizing(0.3, None, False)
    assert vllm_sizing(VLLMConfig(gpu_memory_utilization=0.62), "cuda") == VLLMSizing(0.62, None, False)


def test_set_values_win_on_either_device():
    v = VLLMConfig(gpu_memory_utilization=0.5, kv_cache_gib=2.5, enforce_eager=True)
    assert vllm_sizing(v, "cuda") == vllm_sizing(v, "cpu") == VLLMSizing(0.5, int(2.5 * GIB), True)
    assert vllm_sizing(VLLMConfig(enforce_eager=False), "cpu").enforce_eager is False


def test_on_cuda_vllms_share_is_what_the_plan_leaves_and_the_plan_counts_it(monkeypatch):
    monkeypatch.setattr(memory, "cuda_memory", lambda: DEVICE)
    monkeypatch.setattr(memory, "cuda_free_memory", lambda: (DEVICE, DEVICE))
    cfg = train_config(*RUN)
    plan = memory.build_plan(cfg, 1, DEVICE, device="cuda")
    others = [part for part in plan.parts if part.name != "rollout (vllm)"]
    # asleep during the update: vLLM has the generation phase's memory beside the parts held the whole run
    left = DEVICE - sum(p.bytes for p in others if p.phase == P.ALWAYS) - sum(
        p.bytes for p in others if p.phase == P.GENERATION)
    assert vllm_part(plan).bytes == left and vllm_part(plan).phase == P.GENERATION
    assert plan.total_bytes == DEVICE and plan.fits
    weights = plan.params * 2
    assert left > weights + 10 * GIB  # room for a KV cache far beyond the CPU value's 1 GiB
    rollout = memory.with_vllm_share(cfg, 1)
    assert rollout.vllm.gpu_memory_utilization == math.floor(1000 * left / DEVICE) / 1000
    # planned again with that share: at most what was left, so the run still fits
    planned = memory.build_plan(train_config(*RUN, f"rollout.vllm.gpu_memory_utilization="
                                                   f"{rollout.vllm.gpu_memory_utilization}"), 1, DEVICE, device="cuda")
    assert left - DEVICE / 1000 <= vllm_part(planned).bytes <= left and planned.fits


def test_held_through_the_update_without_sleep_mode(monkeypatch):
    cfg = train_config(*RUN, "rollout.vllm.sleep_mode=false")
    plan = memory.build_plan(cfg, 1, DEVICE, device="cuda")
    others = [part for part in plan.parts if part.name != "rollout (vllm)"]
    held = sum(p.bytes for p in others if p.phase == P.ALWAYS)
    assert vllm_part(plan).phase == P.ALWAYS
    assert vllm_part(plan).bytes == DEVICE - held - plan.phase_bytes(P.UPDATE)


def test_on_cpu_the_plan_counts_a_1_gib_cache_held_the_whole_run():
    plan = memory.build_plan(train_config(*RUN), 1, None, device="cpu")
    # no sleep mode on CPU: the engine keeps its memory through the update
    assert (vllm_part(plan).bytes, vllm_part(plan).phase) == (plan.params * 2 + GIB, P.ALWAYS)


@pytest.mark.parametrize("overrides, device", [
    ([], None),  # no CUDA device
    (["rollout.vllm.gpu_memory_utilization=0.4"], DEVICE),  # a share that is set
    (["rollout=hf"], DEVICE),  # another engine
])
def test_the_share_is_filled_in_only_on_cuda_for_an_unset_vllm_share(monkeypatch, overrides, device):
    monkeypatch.setattr(memory, "cuda_free_memory", lambda: None if device is None else (device, device))
    cfg = train_config(*RUN, *overrides)
    assert memory.with_vllm_share(cfg, 1) == cfg.rollout


@pytest.fixture
def device_with_free(monkeypatch):
    """A CUDA device of DEVICE bytes with `free` of them free (set it), and the stand-in vllm module, which refuses to
    start below its share of the free memory as vLLM does."""
    memory_state = {"free": DEVICE}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *device: (memory_state["free"], DEVICE))
    monkeypatch.setattr(memory, "cuda_memory", lambda: DEVICE)
    fake_vllm.install(monkeypatch)
    return memory_state


def start_engine(*overrides: str):
    """The tiny model's vllm engine started as the trainer starts it: the share filled in just before."""
    cfg = train_config("model=tiny", "rollout=vllm", *overrides)
    tokenizer, model = load_model(cfg.model, cfg.seed)
    return VLLMEngine(memory.with_vllm_share(cfg, 1), tokenizer, Published.of_module(model), torch.device("cpu"))


def test_the_planned_share_is_lowered_to_what_is_free_and_vllm_starts(device_with_free):
    device_with_free["free"] = 30 * GIB  # the trainer and others hold the rest
    engine = start_engine()
    share = engine.llm.calls[0][1]["gpu_memory_utilization"]
    assert share == math.floor(1000 * (30 * GIB - memory.VLLM_START_MARGIN) / DEVICE) / 1000
    assert share * DEVICE <= 30 * GIB - memory.VLLM_START_MARGIN


def test_with_everything_free_the_share_is_the_plans(device_with_free):
    cfg = train_config("model=tiny", "rollout=vllm")
    planned = memory.build_plan(cfg, 1, DEVICE, device="cuda")
    engine = start_engine()
    assert engine.llm.calls[0][1]["gpu_memory_utilization"] == min(
        math.floor(1000 * vllm_part(planned).bytes / DEVICE) / 1000,
        math.floor(1000 * (DEVICE - memory.VLLM_START_MARGIN) / DEVICE) / 1000)


def test_a_set_share_above_the_free_memory_is_refused_in_one_line(device_with_free):
    device_with_free["free"] = 30 * GIB
    with pytest.raises(ConfigError) as err:
        start_engine("rollout.vllm.gpu_memory_utilization=0.5")
    message = str(err.value)
    assert "\n" not in message
    assert "rollout.vllm.gpu_memory_utilization=0.5 asks vLLM for 40.00 GiB" in message
    assert "30.00 GiB of the device's 80.00 GiB is free" in message
    assert "set it at most 0.362" in message


def test_free_memory_below_vllms_weights_is_refused_in_one_line(device_with_free):
    device_with_free["free"] = memory.VLLM_START_MARGIN + 2**20
    with pytest.raises(ConfigError, match=r"^vLLM needs .* \(its weights and one sequence's KV cache\) but 1.00 GiB of "):
        start_engine()

"""Paper setups planned on their stated hardware (scripts/paper_plans.py, docs/experiments.md): all of them fit."""

from __future__ import annotations

import pytest

from tokenpo.plan.cli import compose_train_config, run_world_size
from tokenpo.plan.memory import build_plan

# 8 x 80 GB GPUs, one node, as each file states
FITTING = ("dapo_qwen2_5_math_7b", "gtpo_qwen2_5_7b", "grpo_s_qwen2_5_7b", "grpo_qwen2_5_math_7b", "dapo_qwen2_5_32b",
           "gtpo_qwen2_5_32b", "grpo_s_qwen2_5_32b")
# the 32B setups: (sequences per micro-batch, below a group of 16; checkpointed activations of one, GiB, rounded)
MICRO_32B = {"dapo_qwen2_5_32b": (1, 23), "gtpo_qwen2_5_32b": (4, 24), "grpo_s_qwen2_5_32b": (4, 24)}


@pytest.mark.parametrize("setup", FITTING)
def test_the_setup_fits_its_stated_hardware(setup):
    cfg = compose_train_config([f"experiment=paper/{setup}"])
    plan = build_plan(cfg, run_world_size(cfg), 80 * 2**30, suggest=False)
    assert run_world_size(cfg) == 8
    assert plan.fits, plan.total_bytes


@pytest.mark.parametrize("setup", MICRO_32B)
def test_a_32b_setup_fits_with_micro_batches_below_a_group_and_the_optimizer_in_host_memory(setup):
    cfg = compose_train_config([f"experiment=paper/{setup}"])
    plan = build_plan(cfg, run_world_size(cfg), 80 * 2**30, suggest=False)
    parts = {part.name: part for part in plan.parts}
    rows, activations_gib = MICRO_32B[setup]
    assert (cfg.rollout.engine, cfg.deepspeed.stage, cfg.model.gradient_checkpointing) == ("vllm", 3, True)
    # the rows of one prompt's group, in ceil(16 / rows) passes per group
    assert (plan.shapes.micro_rows, plan.shapes.micro_groups, cfg.rollout.group_size) == (rows, 1, 16)
    assert round(parts["activations"].bytes / 2**30) == activations_gib
    # AdamW states and fp32 master weights: 61 GiB per process in host memory, none on the device
    assert parts["optimizer states"].bytes == parts["fp32 master weights"].bytes == 0
    assert round((parts["optimizer states"].host_bytes + parts["fp32 master weights"].host_bytes) / 2**30) == 61


def test_dapo_on_qwen2_5_math_7b_fills_its_context_and_keeps_the_papers_batch():
    cfg = compose_train_config(["experiment=paper/dapo_qwen2_5_math_7b"])
    assert (cfg.rollout.engine, cfg.deepspeed.precision, cfg.model.hub_id) == ("vllm", "bf16", "Qwen/Qwen2.5-Math-7B")
    # Qwen2.5-Math-7B: 4096 positions
    assert cfg.data.max_prompt_tokens + cfg.rollout.max_new_tokens == 4096
    assert cfg.eval.max_new_tokens == cfg.rollout.max_new_tokens
    assert (cfg.data.prompts_per_step, cfg.rollout.group_size, cfg.trainer.mini_batches) == (512, 16, 16)

"""Paper setups planned on their stated hardware (scripts/paper_plans.py, docs/experiments.md): those that fit."""

from __future__ import annotations

import pytest

from tokenpo.plan.cli import compose_train_config, run_world_size
from tokenpo.plan.memory import build_plan

# 8 x 80 GB GPUs, one node, as each file states
FITTING = ("dapo_qwen2_5_math_7b", "gtpo_qwen2_5_7b", "grpo_s_qwen2_5_7b", "grpo_qwen2_5_math_7b")


@pytest.mark.parametrize("setup", FITTING)
def test_the_setup_fits_its_stated_hardware(setup):
    cfg = compose_train_config([f"experiment=paper/{setup}"])
    plan = build_plan(cfg, run_world_size(cfg), 80 * 2**30, suggest=False)
    assert run_world_size(cfg) == 8
    assert plan.fits, plan.total_bytes


def test_dapo_on_qwen2_5_math_7b_fills_its_context_and_keeps_the_papers_batch():
    cfg = compose_train_config(["experiment=paper/dapo_qwen2_5_math_7b"])
    assert (cfg.rollout.engine, cfg.deepspeed.precision, cfg.model.hub_id) == ("vllm", "bf16", "Qwen/Qwen2.5-Math-7B")
    # Qwen2.5-Math-7B: 4096 positions
    assert cfg.data.max_prompt_tokens + cfg.rollout.max_new_tokens == 4096
    assert cfg.eval.max_new_tokens == cfg.rollout.max_new_tokens
    assert (cfg.data.prompts_per_step, cfg.rollout.group_size, cfg.trainer.mini_batches) == (512, 16, 16)

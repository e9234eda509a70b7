"""model.dtype x deepspeed.precision x ZeRO stage x LoRA: every combination either trains with fp32 master weights and
a KL reference in the policy's dtype (kl/ref exactly 0 at step 1, before the first update), or is refused at
start-up in one line naming both keys."""

from __future__ import annotations

import copy
import itertools
from pathlib import Path

import pytest
import torch

from support.config import SMALL, compose_config, compose_tree
from support.metrics import by_step, read_metrics
from support.runs import in_process_training, train_run
from tokenpo.config import build_config
from tokenpo.deepspeed import dist
from tokenpo.deepspeed.config import DeepSpeedConfig
from tokenpo.deepspeed.engine import build_policy_engine, partitioned_loading
from tokenpo.errors import ConfigError
from tokenpo.models.loading import load_model
from tokenpo.trainer.core.optim import build_optimizer

STAGES = (0, 1, 2, 3)
LORA = {"full": [], "lora": ["model.lora.rank=4"]}
ALLOWED = [("float32", "fp32"), ("float32", "bf16"), ("bfloat16", "bf16")]
REFUSED = {
    ("float16", "fp32"): "model.dtype=float16 trains without loss scaling (deepspeed.precision is fp32 or bf16)",
    ("float16", "bf16"): "model.dtype=float16 trains without loss scaling (deepspeed.precision is fp32 or bf16)",
    ("bfloat16", "fp32"): "model.dtype=bfloat16 with deepspeed.precision=fp32 updates bf16 weights with no fp32 "
                          "master copy",
}


def overrides(dtype: str, precision: str, stage: int, lora: str) -> list[str]:
    return SMALL + [f"deepspeed=zero{stage}", f"model.dtype={dtype}", f"deepspeed.precision={precision}", *LORA[lora]]


@pytest.fixture(scope="module")
def tree():
    """The composed config of a small run, for build_config to check under every combination (composing once)."""
    return compose_tree("train", SMALL)


def every_stage_and_lora(tree, dtype: str, precision: str):
    """build_config of `tree` with these values under each ZeRO stage, with and without LoRA."""
    for stage, rank in itertools.product(STAGES, (0, 4)):
        variant = copy.deepcopy(tree)
        variant.model.dtype, variant.model.lora.rank = dtype, rank
        variant.deepspeed.precision, variant.deepspeed.stage = precision, stage
        yield (stage, rank), lambda variant=variant: build_config(variant)


@pytest.mark.parametrize(("dtype", "precision"), list(REFUSED))
def test_refused_combinations_fail_at_start_up_in_one_line(tree, dtype, precision):
    for where, build in every_stage_and_lora(tree, dtype, precision):
        with pytest.raises(ConfigError) as err:
            build()
        message = str(err.value)
        assert message.startswith(REFUSED[dtype, precision]) and "\n" not in message, where


@pytest.mark.parametrize(("dtype", "precision"), ALLOWED)
def test_allowed_combinations_start(tree, dtype, precision):
    for (stage, rank), build in every_stage_and_lora(tree, dtype, precision):
        cfg = build()
        assert (cfg.model.dtype, cfg.deepspeed.precision, cfg.deepspeed.stage, cfg.model.lora.rank) == (
            dtype, precision, stage, rank)


def adamw_tensor_dtypes(dtype: str, precision: str, stage: int, lora: str) -> set[torch.dtype]:
    """The dtypes of the tensors the run's torch AdamW updates, in an engine built on this process (validation
    bypassed, so refused combinations can be looked at too)."""
    cfg, _ = compose_config(overrides("float32", "fp32", stage, lora))
    cfg.model.dtype = dtype
    ds = DeepSpeedConfig(stage=stage, precision=precision)
    sizes = dict(micro_batch_size=2, max_grad_norm=1.0, world_size=1)
    with in_process_training():
        dist.init_distributed("gloo")
        _, model = load_model(cfg.model, cfg.seed, partitioned_loading(ds, **sizes))
        optimizer = build_optimizer(model, cfg.trainer)
        engine = build_policy_engine(model, optimizer, ds, **sizes)
        # ZeRO-3 hands AdamW its flat fp32 partitions only for the length of a step
        tensors = engine.optimizer.fp32_partitioned_groups_flat if stage == 3 else [
            p for group in optimizer.param_groups for p in group["params"]]
        return {t.dtype for t in tensors}


@pytest.mark.parametrize(("dtype", "precision"), ALLOWED)
def test_allowed_combinations_update_fp32_master_weights_at_stage_0(dtype, precision):
    assert adamw_tensor_dtypes(dtype, precision, 0, "full") == {torch.float32}


def test_bf16_weights_in_fp32_mode_would_be_updated_in_bf16_at_stage_0():
    """Why model.dtype=bfloat16 with deepspeed.precision=fp32 is refused: AdamW gets the bf16 weights themselves."""
    assert adamw_tensor_dtypes("bfloat16", "fp32", 0, "full") == {torch.bfloat16}


@pytest.mark.slow
@pytest.mark.parametrize("lora", list(LORA))
@pytest.mark.parametrize("stage", STAGES)
@pytest.mark.parametrize(("dtype", "precision"), ALLOWED)
def test_every_allowed_combination_updates_fp32_master_weights(dtype, precision, stage, lora):
    assert adamw_tensor_dtypes(dtype, precision, stage, lora) == {torch.float32}


def first_step_kl(run_dir: Path, dtype: str, precision: str, stage: int, lora: str) -> float:
    """kl/ref logged at step 1 of a 1-step run: one mini-batch, so the policy's log-probs are taken before the
    update, from the same weights as the reference's."""
    with in_process_training():
        train_run(run_dir, overrides(dtype, precision, stage, lora) + ["trainer.max_steps=1", "trainer.mini_batches=1",
                                                                      "eval.max_problems=1"])
    return by_step(read_metrics(run_dir))[1]["kl/ref"]


@pytest.mark.parametrize(("dtype", "precision"), [("float32", "bf16"), ("bfloat16", "bf16")])
def test_kl_to_the_reference_is_exactly_zero_at_step_1_under_bf16(tmp_path, dtype, precision):
    """An fp32 model under deepspeed.precision=bf16: DeepSpeed casts the policy to bf16, the reference follows."""
    assert first_step_kl(tmp_path, dtype, precision, 0, "full") == 0.0


@pytest.mark.slow
@pytest.mark.parametrize("lora", list(LORA))
@pytest.mark.parametrize("stage", STAGES)
@pytest.mark.parametrize(("dtype", "precision"), ALLOWED)
def test_kl_to_the_reference_is_exactly_zero_at_step_1_everywhere(tmp_path, dtype, precision, stage, lora):
    assert first_step_kl(tmp_path, dtype, precision, stage, lora) == 0.0


def engine_sums(stage: int, grad_dtype: str) -> tuple[torch.dtype, torch.dtype, int]:
    """(the dtype DeepSpeed reduces gradients in, the dtype it accumulates them in, the ZeRO stage it runs) of the
    policy engine under deepspeed.precision=bf16, built on this process."""
    cfg, _ = compose_config(overrides("float32", "bf16", stage, "full"))
    ds = DeepSpeedConfig(stage=stage, precision="bf16", grad_dtype=grad_dtype)
    sizes = dict(micro_batch_size=2, max_grad_norm=1.0, world_size=1)
    with in_process_training():
        dist.init_distributed("gloo")
        _, model = load_model(cfg.model, cfg.seed, partitioned_loading(ds, **sizes))
        engine = build_policy_engine(model, build_optimizer(model, cfg.trainer), ds, **sizes)
        return engine.communication_data_type, engine.get_data_types()[1], engine.zero_optimization_stage()


@pytest.mark.parametrize("stage", STAGES)
def test_bf16_gradients_are_reduced_and_accumulated_in_fp32(stage):
    """deepspeed.grad_dtype=fp32 (the default): DeepSpeed reduces across ranks and accumulates across micro-batches in
    fp32 (its bf16 default rounds every partial sum to 8 bits; scripts/bf16_grad_sums.py measures the difference);
    at stage 0 DeepSpeed's ZeRO-1 bf16 optimizer, the one that keeps fp32 gradients, runs."""
    assert engine_sums(stage, "fp32") == (torch.float32, torch.float32, max(stage, 1))


def test_grad_dtype_bf16_keeps_deepspeeds_bf16_sums():
    assert engine_sums(2, "bf16") == (torch.bfloat16, torch.bfloat16, 2)
    assert engine_sums(0, "bf16")[2] == 0

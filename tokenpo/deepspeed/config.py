"""Typed schema of the `deepspeed` config group and the DeepSpeed JSON config derived from a run."""

from __future__ import annotations

from dataclasses import dataclass

from tokenpo.errors import ConfigError


@dataclass
class DeepSpeedConfig:
    stage: int = 0
    offload_optimizer: bool = False
    offload_param: bool = False
    precision: str = "fp32"
    overlap_comm: bool = False
    reduce_bucket_size: int = 50_000_000
    stage3_prefetch_bucket_size: int = 50_000_000
    stage3_max_live_parameters: int = 1_000_000_000
    backend: str = "auto"

    def validate(self) -> None:
        if self.stage not in (0, 1, 2, 3):
            raise ConfigError(f"deepspeed.stage must be 0, 1, 2 or 3, got {self.stage}")
        if self.precision not in ("fp32", "bf16"):
            raise ConfigError(f"deepspeed.precision must be fp32 or bf16, got {self.precision!r}")
        if self.offload_param and self.stage != 3:
            raise ConfigError(f"deepspeed.offload_param needs deepspeed.stage=3, got stage {self.stage}")
        if self.offload_optimizer and self.stage == 0:
            raise ConfigError("deepspeed.offload_optimizer needs deepspeed.stage >= 1")
        if self.overlap_comm and self.stage != 2:
            raise ConfigError("deepspeed.overlap_comm is only supported with deepspeed.stage=2")
        if self.backend not in ("auto", "nccl", "gloo"):
            raise ConfigError(f"deepspeed.backend must be auto, nccl or gloo, got {self.backend!r}")


def check_precision(model_dtype: str, precision: str) -> None:
    """model.dtype x deepspeed.precision: each allowed pair trains with fp32 master weights (at every ZeRO stage, with
    or without LoRA); the others are refused in one line naming both keys."""
    if model_dtype == "float16":
        # fp16 needs a (dynamic) loss scale, which neither precision configures: small gradients underflow to 0
        raise ConfigError("model.dtype=float16 trains without loss scaling (deepspeed.precision is fp32 or bf16): "
                          "use model.dtype=bfloat16 with deepspeed.precision=bf16")
    if model_dtype == "bfloat16" and precision == "fp32":
        # without DeepSpeed's bf16 mode ZeRO-0 hands the bf16 weights to AdamW itself: an update below bf16's
        # resolution (lr 1e-6 on a weight of 1) rounds away. One route per dtype, so refused at every stage
        raise ConfigError("model.dtype=bfloat16 with deepspeed.precision=fp32 updates bf16 weights with no fp32 "
                          "master copy: set deepspeed.precision=bf16 (fp32 master weights) or model.dtype=float32")


def engine_json(cfg: DeepSpeedConfig, *, micro_batch_size: int, world_size: int, max_grad_norm: float) -> dict:
    """DeepSpeed's own config dict. Accumulation is caller-owned: every `engine.step()` is a boundary,
    so a step may hold any number of micro-batches and the loss normaliser stays global."""
    zero: dict = {"stage": cfg.stage, "reduce_bucket_size": cfg.reduce_bucket_size, "overlap_comm": cfg.overlap_comm}
    if cfg.stage == 3:
        zero["stage3_prefetch_bucket_size"] = cfg.stage3_prefetch_bucket_size
        zero["stage3_max_live_parameters"] = cfg.stage3_max_live_parameters
        zero["stage3_gather_16bit_weights_on_model_save"] = True
    if cfg.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu"}
    if cfg.offload_param:
        zero["offload_param"] = {"device": "cpu"}
    return {
        "train_micro_batch_size_per_gpu": micro_batch_size,
        "gradient_accumulation_steps": 1,
        "train_batch_size": micro_batch_size * world_size,
        "managed_gradient_accumulation": False,
        "gradient_clipping": max_grad_norm,
        "zero_optimization": zero,
        "bf16": {"enabled": cfg.precision == "bf16"},
        # a torch AdamW is passed in: no JIT-built DeepSpeed optimizer, also under offload
        "zero_force_ds_cpu_optimizer": False,
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }

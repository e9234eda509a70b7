"""Typed schema of the `deepspeed` config group and the DeepSpeed JSON config derived from a run."""

from __future__ import annotations

from dataclasses import dataclass

from tokenpo.schema import check_fields, require, setting

# seconds a collective waits for the slowest process before the run fails (trainer.dist_timeout_s's default): a DAPO
# round of 20k-token generations or rank 0 hashing a large checkpoint outlasts DeepSpeed's 10 minutes
COLLECTIVE_TIMEOUT_S = 7200.0


@dataclass
class DeepSpeedConfig:
    stage: int = setting(0, "ZeRO stage (0-3)", choices=(0, 1, 2, 3), requirement="0, 1, 2 or 3")
    offload_optimizer: bool = setting(False,
        "Keep optimizer states in CPU memory (ZeRO 1-3; slower, frees accelerator memory)")
    offload_param: bool = setting(False, "Keep parameters in CPU memory (ZeRO-3 only)")
    precision: str = setting("auto",
        "Training precision: auto (bf16 when model.dtype is bfloat16, else fp32: a model preset's dtype brings the "
        "precision it needs) | fp32 | bf16 (bf16 needs an accelerator or a CPU with fast bf16)",
        choices=("auto", "fp32", "bf16"), requirement="auto, fp32 or bf16")
    overlap_comm: bool = setting(False,
        "Overlap gradient reduction with the backward pass (ZeRO-2 only, under tokenpo's caller-owned accumulation)")
    reduce_bucket_size: int = setting(50_000_000, "Gradient bucket size in elements for reduce/all-reduce")
    stage3_prefetch_bucket_size: int = setting(50_000_000, "Elements per ZeRO-3 parameter prefetch bucket")
    stage3_max_live_parameters: int = setting(1_000_000_000,
        "Most ZeRO-3 parameter elements gathered at once while training (DeepSpeed's default: 1e9)")
    backend: str = setting("auto", "Backend for several processes: auto = nccl with GPUs, gloo on CPU",
        choices=("auto", "nccl", "gloo"), requirement="auto, nccl or gloo")
    grad_dtype: str = setting("fp32",
        "Under precision=bf16, the dtype gradients are summed in, across processes (the reduction) and across "
        "micro-batches (the accumulation): fp32 | bf16. fp32, as verl's FSDP reduces: each sum exact to fp32 "
        "rounding, for an fp32 gradient buffer (4 bytes a trained parameter; a 1/world partition at ZeRO 2-3) and "
        "twice bf16's reduction traffic; at ZeRO 0 DeepSpeed offers it only through its ZeRO-1 bf16 optimizer, "
        "which tokenpo then runs (with one process it partitions nothing). bf16: DeepSpeed's default, every partial "
        "sum rounded to bf16's 8 significant bits (docs/distributed.md measures the difference). No effect in fp32",
        choices=("fp32", "bf16"), requirement="fp32 or bf16")

    def validate(self) -> None:
        check_fields(self, "deepspeed")
        require(not self.offload_param or self.stage == 3,
                f"deepspeed.offload_param needs deepspeed.stage=3, got stage {self.stage}")
        require(not self.offload_optimizer or self.stage != 0, "deepspeed.offload_optimizer needs deepspeed.stage >= 1")
        require(not self.overlap_comm or self.stage == 2,
                "deepspeed.overlap_comm is only supported with deepspeed.stage=2")


    @property
    def partitioned(self) -> bool:
        """ZeRO-3: each process holds a shard of every parameter, so reading a module's weights whole is a collective
        (the one place tokenpo decides it)."""
        return self.stage == 3

    @property
    def fp32_grad_sums(self) -> bool:
        """Gradients reduced and accumulated in fp32 although the model trains in bf16 (grad_dtype)."""
        return self.precision == "bf16" and self.grad_dtype == "fp32"

    @property
    def engine_stage(self) -> int:
        """The ZeRO stage DeepSpeed runs: `stage`, but 1 for stage 0 with fp32 gradient sums under bf16 (DeepSpeed
        refuses fp32 gradient accumulation beside bf16 weights without ZeRO; its ZeRO-1 bf16 optimizer keeps them)."""
        return 1 if self.stage == 0 and self.fp32_grad_sums else self.stage


def check_precision(model_dtype: str, precision: str) -> None:
    """model.dtype x deepspeed.precision: each allowed pair trains with fp32 master weights (at every ZeRO stage, with
    or without LoRA); the others are refused in one line naming both keys."""
    # fp16 needs a (dynamic) loss scale, which neither precision configures: small gradients underflow to 0
    require(model_dtype != "float16", "model.dtype=float16 trains without loss scaling (deepspeed.precision is fp32 "
                                      "or bf16): use model.dtype=bfloat16 with deepspeed.precision=bf16")
    # without DeepSpeed's bf16 mode ZeRO-0 hands the bf16 weights to AdamW itself: an update below bf16's
    # resolution (lr 1e-6 on a weight of 1) rounds away. One route per dtype, so refused at every stage
    require(not (model_dtype == "bfloat16" and precision == "fp32"),
            "model.dtype=bfloat16 with deepspeed.precision=fp32 updates bf16 weights with no fp32 master copy: set "
            "deepspeed.precision=bf16 (fp32 master weights) or model.dtype=float32")


def engine_json(cfg: DeepSpeedConfig, *, micro_batch_size: int, world_size: int, max_grad_norm: float) -> dict:
    """DeepSpeed's own config dict. Accumulation is caller-owned: every `engine.step()` is a boundary,
    so a step may hold any number of micro-batches and the loss normaliser stays global."""
    zero: dict = {"stage": cfg.engine_stage, "reduce_bucket_size": cfg.reduce_bucket_size, "overlap_comm": cfg.overlap_comm}
    if cfg.partitioned:
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
        # under bf16, DeepSpeed otherwise reduces and accumulates gradients in bf16 (deepspeed.grad_dtype)
        **({"communication_data_type": "fp32", "data_types": {"grad_accum_dtype": "fp32"}}
           if cfg.fp32_grad_sums else {}),
        # a torch AdamW is passed in: no JIT-built DeepSpeed optimizer, also under offload
        "zero_force_ds_cpu_optimizer": False,
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }

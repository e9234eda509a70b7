"""Typed schema of the `trainer` config group."""

from __future__ import annotations

from dataclasses import dataclass

from tokenpo.errors import ConfigError

LR_SCHEDULES = ("constant", "cosine", "linear")
VERIFY_CHECKPOINTS = ("full", "sizes")


@dataclass
class TrainerConfig:
    max_steps: int = 40
    lr: float = 2e-5
    warmup_steps: int = 2
    lr_schedule: str = "constant"
    weight_decay: float = 0.0
    adam_betas: tuple = (0.9, 0.999)
    max_grad_norm: float = 1.0
    mini_batches: int = 1
    micro_batch_size: int = 32
    nproc: int = 1
    dist_timeout_s: float = 7200.0
    save_every: int = 0
    keep_last: int = 2
    resume: str = "auto"
    verify_checkpoints: str = "full"
    threads: int = 0
    logit_chunk_tokens: int = 1024
    recompute_head: bool = False
    memory_limit: int | str | None = None
    worst_case_first: bool | None = None
    print_samples: int = 4
    objective: str | None = "eval/accuracy"

    def validate(self) -> None:
        positive = ("max_steps", "mini_batches", "micro_batch_size", "nproc", "keep_last", "logit_chunk_tokens")
        for key in positive:
            if getattr(self, key) < 1:
                raise ConfigError(f"trainer.{key} must be >= 1, got {getattr(self, key)}")
        for key in ("warmup_steps", "save_every", "threads", "print_samples", "weight_decay", "max_grad_norm"):
            if getattr(self, key) < 0:
                raise ConfigError(f"trainer.{key} must be >= 0, got {getattr(self, key)}")
        for key in ("lr", "dist_timeout_s"):
            if not getattr(self, key) > 0:
                raise ConfigError(f"trainer.{key} must be > 0, got {getattr(self, key)}")
        if self.verify_checkpoints not in VERIFY_CHECKPOINTS:
            raise ConfigError(f"trainer.verify_checkpoints must be one of {', '.join(VERIFY_CHECKPOINTS)}, "
                              f"got {self.verify_checkpoints!r}")
        if self.lr_schedule not in LR_SCHEDULES:
            raise ConfigError(f"trainer.lr_schedule must be one of {', '.join(LR_SCHEDULES)}, got {self.lr_schedule!r}")
        if self.memory_limit is not None:
            from tokenpo.plan.units import parse_bytes

            parse_bytes(self.memory_limit, "trainer.memory_limit")
        if len(self.adam_betas) != 2 or not all(0 <= b < 1 for b in self.adam_betas):
            raise ConfigError(f"trainer.adam_betas must be two numbers in [0, 1), got {list(self.adam_betas)}")

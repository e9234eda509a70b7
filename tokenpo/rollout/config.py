"""Typed schema of the `rollout` config group."""

from __future__ import annotations

from dataclasses import dataclass

from tokenpo.errors import ConfigError
from tokenpo.schema import from_dict


@dataclass
class RolloutConfig:
    engine: str = "hf"
    group_size: int = 4
    max_new_tokens: int = 32
    temperature: float = 1.0
    top_p: float = 1.0
    share_prefill: bool = True
    eos_tokens: tuple = ()

    def validate(self) -> None:
        from tokenpo.rollout.engine import get_engine

        get_engine(self.engine)
        if self.group_size < 1:
            raise ConfigError(f"rollout.group_size must be >= 1, got {self.group_size}")
        if self.max_new_tokens < 1:
            raise ConfigError(f"rollout.max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ConfigError(f"rollout.temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"rollout.top_p must be in (0, 1], got {self.top_p}")


def rollout_config_from_dict(d: dict) -> RolloutConfig:
    cfg = from_dict(RolloutConfig, d, "rollout")
    cfg.validate()
    return cfg

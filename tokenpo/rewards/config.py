"""The `reward` config section: a typed schema checked at start-up, and its merge with dataset defaults."""

import math
from dataclasses import dataclass, replace
from typing import Mapping

from tokenpo.errors import ConfigError
from tokenpo.schema import from_dict
from tokenpo.rewards.extract import ANSWER_PATTERNS, FALLBACKS
from tokenpo.rewards.verify import ANSWER_FORMATS

# Fields a dataset may set (arith: number + last_number; math: expression); null here defers to the dataset.
DATASET_FIELDS = ("answer_format", "answer_pattern", "fallback")
BUILTIN_DEFAULTS = {"answer_format": "auto", "answer_pattern": "boxed", "fallback": "none"}
_CHOICES = {"answer_format": ANSWER_FORMATS, "answer_pattern": tuple(ANSWER_PATTERNS), "fallback": tuple(FALLBACKS)}


@dataclass
class RewardConfig:
    """The `reward` section; conf/reward/default.yaml mirrors it and documents each field."""

    fn: str | None = None
    answer_format: str | None = None
    answer_pattern: str | None = None
    fallback: str | None = None
    format_weight: float = 0.0
    timeout_s: float = 5.0
    num_workers: int = 2

    def validate(self) -> "RewardConfig":
        if self.fn is not None and (not isinstance(self.fn, str) or self.fn.count(":") != 1):
            raise ConfigError(f"reward.fn must be null or 'package.module:function', got {self.fn!r}")
        for name in DATASET_FIELDS:
            _check_choice(f"reward.{name}", name, getattr(self, name))
        if not _is_number(self.format_weight) or not math.isfinite(self.format_weight) or self.format_weight < 0:
            raise ConfigError(f"reward.format_weight must be a finite number >= 0, got {self.format_weight!r}")
        # math-verify's own timeouts are whole seconds (signal.alarm)
        if not _is_number(self.timeout_s) or not self.timeout_s >= 1:
            raise ConfigError(f"reward.timeout_s must be a number of seconds >= 1, got {self.timeout_s!r}")
        if not isinstance(self.num_workers, int) or isinstance(self.num_workers, bool) or self.num_workers < 1:
            raise ConfigError(f"reward.num_workers must be an integer >= 1, got {self.num_workers!r}")
        return self


def _check_choice(label: str, name: str, value) -> None:
    if value is not None and value not in _CHOICES[name]:
        raise ConfigError(f"{label} must be null or one of {', '.join(_CHOICES[name])}, got {value!r}")


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def reward_config_from_dict(section: Mapping) -> RewardConfig:
    """RewardConfig from the `reward` config section (a dict or DictConfig), validated."""
    return from_dict(RewardConfig, dict(section.items()), "reward").validate()


def resolve(reward_cfg: RewardConfig, dataset_defaults: Mapping) -> RewardConfig:
    """`reward_cfg` with each null answer_format/answer_pattern/fallback taken from the dataset, else built in.

    Other keys of `dataset_defaults` are ignored, so a dataset may pass its whole config section.
    """
    filled = {}
    for name in DATASET_FIELDS:
        value = getattr(reward_cfg, name)
        if value is None:
            value = dataset_defaults.get(name)
            _check_choice(f"the dataset's default {name}", name, value)
        filled[name] = BUILTIN_DEFAULTS[name] if value is None else value
    return replace(reward_cfg, **filled).validate()

"""The `reward` config section: a typed schema checked at start-up, and its merge with dataset defaults."""

import math
import re
from dataclasses import dataclass, replace
from typing import Mapping

from tokenpo.errors import ConfigError
from tokenpo.schema import from_dict
from tokenpo.rewards.extract import ANSWER_FORMATS, ANSWER_PATTERNS, FALLBACKS

# Fields a dataset may set (arith: number + last_number; math: expression); null here defers to the dataset.
DATASET_FIELDS = ("answer_format", "answer_pattern", "fallback")
BUILTIN_DEFAULTS = {"answer_format": "auto", "answer_pattern": "boxed", "fallback": "none"}
_CHOICES = {"answer_format": ANSWER_FORMATS, "answer_pattern": ANSWER_PATTERNS.names(), "fallback": FALLBACKS.names()}
# An XML-like tag name, written without its angle brackets.
_TAG_NAME_RE = re.compile(r"[A-Za-z_][\w-]*")


@dataclass
class RewardConfig:
    """The `reward` section; conf/reward/default.yaml mirrors it and documents each field."""

    fn: str | None = None
    answer_format: str | None = None
    answer_pattern: str | None = None
    fallback: str | None = None
    reasoning_tag: str | None = "think"
    format_weight: float = 0.0
    timeout_s: float = 5.0
    decimal_tolerance: float | None = None
    num_workers: int = 2
    worker_max_items: int | None = 1000
    worker_max_rss_mb: int | None = 512

    def validate(self) -> "RewardConfig":
        if self.fn is not None and (not isinstance(self.fn, str) or self.fn.count(":") != 1):
            raise ConfigError(f"reward.fn must be null or 'package.module:function', got {self.fn!r}")
        for name in DATASET_FIELDS:
            _check_choice(f"reward.{name}", name, getattr(self, name))
        if self.reasoning_tag is not None and not (
            isinstance(self.reasoning_tag, str) and _TAG_NAME_RE.fullmatch(self.reasoning_tag)
        ):
            raise ConfigError(f"reward.reasoning_tag must be null or a tag name like think, got {self.reasoning_tag!r}")
        if not _is_number(self.format_weight) or not math.isfinite(self.format_weight) or self.format_weight < 0:
            raise ConfigError(f"reward.format_weight must be a finite number >= 0, got {self.format_weight!r}")
        # below a second, ordinary answers on a loaded machine start to time out
        if not _is_number(self.timeout_s) or not self.timeout_s >= 1:
            raise ConfigError(f"reward.timeout_s must be a number of seconds >= 1, got {self.timeout_s!r}")
        if self.decimal_tolerance is not None and not (
            _is_number(self.decimal_tolerance) and math.isfinite(self.decimal_tolerance) and self.decimal_tolerance >= 0
        ):
            raise ConfigError(
                f"reward.decimal_tolerance must be null or a finite number >= 0, got {self.decimal_tolerance!r}"
            )
        if not _is_positive_int(self.num_workers):
            raise ConfigError(f"reward.num_workers must be an integer >= 1, got {self.num_workers!r}")
        for name in ("worker_max_items", "worker_max_rss_mb"):
            if getattr(self, name) is not None and not _is_positive_int(getattr(self, name)):
                raise ConfigError(f"reward.{name} must be null or an integer >= 1, got {getattr(self, name)!r}")
        return self


def _check_choice(label: str, name: str, value) -> None:
    if value is not None and value not in _CHOICES[name]:
        raise ConfigError(f"{label} must be null or one of {', '.join(_CHOICES[name])}, got {value!r}")


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_positive_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


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

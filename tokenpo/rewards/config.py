"""The `reward` config section: a typed schema checked at start-up, and its merge with dataset defaults."""

import re
from dataclasses import dataclass, replace
from typing import Mapping

from tokenpo.schema import build, check_field, check_fields, setting
from tokenpo.rewards.extract import ANSWER_FORMATS, ANSWER_PATTERNS, FALLBACKS
from tokenpo.rewards.weighted import DEFAULT_FUNCTIONS, check_entries

# Fields a dataset may set (arith: number + last_number; math: expression); null here defers to the dataset.
DATASET_FIELDS = ("answer_format", "answer_pattern", "fallback")
BUILTIN_DEFAULTS = {"answer_format": "auto", "answer_pattern": "boxed", "fallback": "none"}
# An XML-like tag name, written without its angle brackets.
_TAG_NAME_RE = re.compile(r"[A-Za-z_][\w-]*")


def _is_entry_point(value) -> bool:
    return isinstance(value, str) and value.count(":") == 1


def _is_tag_name(value) -> bool:
    return isinstance(value, str) and _TAG_NAME_RE.fullmatch(value) is not None


@dataclass
class RewardConfig:
    """The `reward` section; conf/reward/default.yaml writes each field with its help and default."""

    fn: str | None = setting(None,
        'User verifier "package.module:function" with verify\'s signature (response, gold) -> bool | null, in place of '
        "the built-in check (the verdict: training and held-out accuracy); null = built-in check.",
        check=_is_entry_point, requirement="null or 'package.module:function'")
    functions: list = setting([dict(entry) for entry in DEFAULT_FUNCTIONS],
        "The training reward: weighted reward functions [{fn, weight}], summed; fn is correctness (the verdict: 1 "
        'correct, 0 not, null unreadable gold) or "package.module:function" called as (response, gold, prompt, '
        "fields) -> float (partial credit) | null; the reward is algorithm.reward.wrong + (correct - wrong) x the sum "
        "(docs/rewards.md).")
    answer_format: str | None = setting(None,
        "Answer check: number (one numeric literal, only a unit word beside it, compared exactly; `15 + 54` is wrong, "
        "resists echoing the question), expression (math-verify equivalence), auto (number when the gold is a plain "
        "number); null = the dataset's setting, else auto.",
        choices=ANSWER_FORMATS)
    answer_pattern: str | None = setting(None,
        'Where the answer is asked for: boxed (last outermost \\boxed{}), answer_line (DAPO\'s last "Answer: '
        '..."); null '
        "= the dataset's setting, else boxed.",
        choices=ANSWER_PATTERNS.names)
    fallback: str | None = setting(None,
        "If the asked-for form is absent: none (no answer, wrong), last_number (small models rarely box; gives "
        "arithmetic data signal), last_dollar (last $...$); null = the dataset's setting, else none.",
        choices=FALLBACKS.names)
    reasoning_tag: str | None = setting("think",
        "Reasoning block tag: only text after the last </think> is scored, and an unclosed block means no answer yet "
        "(R1-style models); null = score the whole response.",
        check=_is_tag_name, requirement="null or a tag name like think")
    format_weight: float = setting(0.0,
        "Reward added when the asked-for answer form is present (reward units, default 0 = off); a small value teaches "
        "\\boxed{} but also pays wrong boxed answers.",
        finite=True, ge=0)
    # >= 1: below a second, ordinary answers on a loaded machine start to time out
    timeout_s: float = setting(5.0,
        'Wall-clock limit per response in seconds (>= 1, default 5); a pathological expression scores "timeout" (wrong)'
        " within timeout_s + 0.5 s and a stuck worker is replaced.",
        ge=1, requirement="a number of seconds >= 1")
    decimal_tolerance: float | None = setting(None,
        "Under expression: largest distance at which a decimal answer matches an exact gold such as 1/3, sqrt(2), pi "
        "(5e-7 = right to 6 places); null/0 (default) = only an exactly equal decimal (0.5 for 1/2), refusing rounded "
        "ones (math-verify's own 6-place rounding is a learnable hack).",
        finite=True, ge=0)
    num_workers: int = setting(2,
        "Worker processes that score a batch's responses in parallel (default 2); processes because the timeout timer "
        "needs a main thread and a stuck one must be killed.",
        ge=1, requirement="an integer >= 1")
    worker_max_items: int | None = setting(1000,
        "Items a worker scores before it is replaced by a fresh process (default 1000; sympy's caches grow up to ~0.14 "
        "MB per distinct item); null = never.",
        ge=1, requirement="null or an integer >= 1")
    worker_max_rss_mb: int | None = setting(512,
        "Resident memory in MB above which a worker is replaced after its item (default 512; a fresh one is ~80 MB); "
        "null = no limit.",
        ge=1, requirement="null or an integer >= 1")

    def validate(self) -> "RewardConfig":
        check_fields(self, "reward")
        check_entries(self.functions)
        return self


def reward_config_from_dict(section: Mapping) -> RewardConfig:
    """RewardConfig from the `reward` config section (a dict or DictConfig), validated."""
    return build(RewardConfig, dict(section.items()), "reward")


def resolve(reward_cfg: RewardConfig, dataset_defaults: Mapping) -> RewardConfig:
    """`reward_cfg` with each null answer_format/answer_pattern/fallback taken from the dataset, else built in.

    Other keys of `dataset_defaults` are ignored, so a dataset may pass its whole config section.
    """
    filled = {}
    for name in DATASET_FIELDS:
        value = getattr(reward_cfg, name)
        if value is None:
            value = dataset_defaults.get(name)
            check_field(RewardConfig, name, value, f"the dataset's default {name}")
        filled[name] = BUILTIN_DEFAULTS[name] if value is None else value
    return replace(reward_cfg, **filled).validate()

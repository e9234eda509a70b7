"""`data` config schema: which dataset, how prompts are built, and the dataset's reward defaults."""

from __future__ import annotations

import re
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator

from omegaconf import DictConfig, OmegaConf

from tokenpo.data.arith import ArithConfig
from tokenpo.data.loaders import SPLIT_SLOT, TABLE_SPECS, get_loader
from tokenpo.data.prompts import OVERLONG_PROMPT, PromptTemplate
from tokenpo.errors import ConfigError
from tokenpo.rewards.extract import ANSWER_FORMATS, ANSWER_PATTERNS, FALLBACKS
from tokenpo.schema import from_dict

# Reward defaults carried by the dataset (the reward config fills its nulls from these). A dataset states its
# answers' format; `auto` (guess it from each gold answer) is left to the reward config.
DATASET_ANSWER_FORMATS = tuple(name for name in ANSWER_FORMATS if name != "auto")
# a `data.` key in an error message (not inside a path or a longer name such as mydata.x)
_DATA_KEY_RE = re.compile(r"(?<![\w./-])data\.")


@contextmanager
def data_keys_under(key: str) -> Iterator[None]:
    """A ConfigError raised inside names the data section's keys as `key` (eval.data, eval.extra[0].data) instead of
    `data`: a benchmark's data section is checked by the code that checks the training data."""
    try:
        yield
    except ConfigError as err:
        raise ConfigError(_DATA_KEY_RE.sub(f"{key}.", str(err))) from err


@dataclass
class DataConfig:
    """The `data` config group; every field is documented in conf/data/*.yaml.

    `path` (a local file, `{split}` replaced by the split name) takes precedence over the hub; a null
    `hub_id`/`prompt_key`/`answer_key` means the named loader's default. `answer_format`, `answer_pattern` and
    `fallback` are the dataset's reward defaults. `max_prompt_tokens` caps the rendered prompt's token count
    (0/null: no cap); `overlong_prompt` says what a longer prompt becomes (tokenpo.data.prompts.OVERLONG_PROMPT).
    """

    name: str = "arith"
    loader: str = "arith"
    path: str | None = None
    hub_id: str | None = None
    hub_config: str | None = None
    train_split: str | None = "train"
    eval_split: str | None = "test"
    prompt_key: str | None = None
    answer_key: str | None = None
    max_train_examples: int | None = None
    max_eval_examples: int | None = None
    prompts_per_step: int = 8
    max_prompt_tokens: int | None = None
    overlong_prompt: str = "drop"
    template: PromptTemplate = field(default_factory=PromptTemplate)
    arith: ArithConfig = field(default_factory=ArithConfig)
    answer_format: str = "number"
    answer_pattern: str = "boxed"
    fallback: str = "last_number"

    def validate(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ConfigError(f"data.name must be a non-empty string, got {self.name!r}")
        get_loader(self.loader)
        for key in ("path", "hub_id", "hub_config", "train_split", "eval_split", "prompt_key", "answer_key"):
            value = getattr(self, key)
            if value is not None and (not isinstance(value, str) or not value):
                raise ConfigError(f"data.{key} must be a non-empty string or null, got {value!r}")
        for key in ("max_train_examples", "max_eval_examples", "prompts_per_step"):
            value = getattr(self, key)
            if value is None and key != "prompts_per_step":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"data.{key} must be an integer >= 1, got {value!r}")
        cap = self.max_prompt_tokens
        if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 0):
            raise ConfigError(f"data.max_prompt_tokens must be an integer >= 0 or null (0 and null: no cap), "
                              f"got {cap!r}")
        for key, choices in (("answer_format", DATASET_ANSWER_FORMATS),
                             ("answer_pattern", ANSWER_PATTERNS.names()), ("fallback", FALLBACKS.names()),
                             ("overlong_prompt", OVERLONG_PROMPT)):
            if getattr(self, key) not in choices:
                raise ConfigError(f"data.{key} must be one of {', '.join(choices)}, got {getattr(self, key)!r}")
        if self.train_split is None and self.eval_split is None:
            raise ConfigError("data.train_split and data.eval_split are both null; set at least one")
        if self.train_split is not None and self.train_split == self.eval_split:
            raise ConfigError(f"data.eval_split must differ from data.train_split, both are {self.train_split!r}")
        self.template.validate()
        self._validate_source()

    def _validate_source(self) -> None:
        if self.loader == "arith":
            for key in ("path", "hub_id", "hub_config", "prompt_key", "answer_key"):
                if getattr(self, key) is not None:
                    raise ConfigError(f"data.{key} is not used by loader 'arith'; set it to null")
            self.arith.validate()
            return
        spec = TABLE_SPECS[self.loader]
        if spec.needs_path and self.path is None:
            raise ConfigError("data.path must be set for loader 'file' (a .jsonl, .json, .parquet or .csv file)")
        if spec.needs_hub and self.hub_id is None:
            raise ConfigError("data.hub_id must be set for loader 'hub'")
        both_splits = self.train_split is not None and self.eval_split is not None
        if self.path is not None and both_splits and SPLIT_SLOT not in self.path:
            raise ConfigError(
                f"data.path {self.path!r} would serve both train and eval splits; put {SPLIT_SLOT} in it "
                "(e.g. gsm8k_{split}.jsonl) or set one of data.train_split/data.eval_split to null"
            )


def data_config_from_dict(values) -> DataConfig:
    """A validated DataConfig from a plain dict or the Hydra `data` node."""
    if isinstance(values, DictConfig):
        values = OmegaConf.to_container(values, resolve=True)
    cfg = from_dict(DataConfig, values, "data")
    cfg.validate()
    return cfg

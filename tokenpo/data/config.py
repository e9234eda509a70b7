"""`data` config schema: which dataset, how prompts are built, and the dataset's reward defaults."""

from __future__ import annotations

import re
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

from omegaconf import DictConfig, OmegaConf

from tokenpo.data.arith import ArithConfig
from tokenpo.data.loaders import SPLIT_SLOT, TABLE_SPECS, get_loader
from tokenpo.data.prompts import OVERLONG_PROMPT, PromptTemplate
from tokenpo.errors import ConfigError
from tokenpo.rewards.extract import ANSWER_FORMATS, ANSWER_PATTERNS, FALLBACKS
from tokenpo.schema import build, check_fields, non_empty, require, section, setting

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
    """The `data` config group (each field's help is the comment above its key in conf/data/arith.yaml).

    `path` (a local file, `{split}` replaced by the split name) takes precedence over the hub; a null
    `hub_id`/`prompt_key`/`answer_key` means the named loader's default. `answer_format`, `answer_pattern` and
    `fallback` are the dataset's reward defaults. `max_prompt_tokens` caps the rendered prompt's token count
    (0/null: no cap); `overlong_prompt` says what a longer prompt becomes (tokenpo.data.prompts.OVERLONG_PROMPT).
    """

    name: str = setting("arith", "Label for logs, example uids and run names.", check=non_empty,
                        requirement="a non-empty string")
    loader: str = setting("arith",
        "Loader registry name: arith, gsm8k, math, math500, dapo_math_17k, aime24, aime25, amc23, file, hub.")
    path: str | None = setting(None, "Local data file; unused by arith (problems are generated).",
        check=non_empty, requirement="a non-empty string or null")
    hub_id: str | None = setting(None, "Hub dataset id; unused by arith.",
        check=non_empty, requirement="a non-empty string or null")
    hub_config: str | None = setting(None, "Hub dataset config; unused by arith.",
        check=non_empty, requirement="a non-empty string or null")
    train_split: str | None = setting("train", "Label of the training split (null = no training split).",
        check=non_empty, requirement="a non-empty string or null")
    eval_split: str | None = setting("test",
        "Label of the held-out eval split, disjoint from training (null = no eval split).",
        check=non_empty, requirement="a non-empty string or null")
    prompt_key: str | None = setting(None, "Field holding the problem; unused by arith.",
        check=non_empty, requirement="a non-empty string or null")
    answer_key: str | None = setting(None, "Field holding the gold answer; unused by arith.",
        check=non_empty, requirement="a non-empty string or null")
    max_train_examples: int | None = setting(None, "Cap on training examples, a seeded random subset (null = all).",
        ge=1, requirement="an integer >= 1")
    max_eval_examples: int | None = setting(None, "Cap on eval examples, the first N (null = all).",
        ge=1, requirement="an integer >= 1")
    prompts_per_step: int = setting(8, "Prompts sampled per training step (each gets a group of responses).",
        ge=1, requirement="an integer >= 1")
    max_prompt_tokens: int | None = setting(None,
        "Cap on a prompt's tokens (the model's tokenizer, template applied; 0 or null = no cap; verl's "
        "max_prompt_length).",
        ge=0, requirement="an integer >= 0 or null (0 and null: no cap)")
    overlong_prompt: str = setting("drop",
        "A longer prompt: drop (removed at load time, count logged), truncate_left (keep the end: question's end, "
        "instruction, generation prompt), truncate_middle (keep both ends), error (stop at start-up).",
        choices=OVERLONG_PROMPT)
    template: PromptTemplate = section(PromptTemplate,
        "How a problem becomes the prompt text (logged at start-up).")
    arith: ArithConfig = section(ArithConfig, "Arithmetic curriculum (loader arith only).")
    answer_format: str = setting("number", "Reward default: gold answers are integers, compared as numbers.",
        choices=DATASET_ANSWER_FORMATS)
    answer_pattern: str = setting("boxed", "Reward default: the answer is read from the last \\boxed{}.",
        choices=ANSWER_PATTERNS.names)
    fallback: str = setting("last_number",
        'Reward default without \\boxed{}: the last number (an echoed "15 + 54" ends in 54, so echoing the question '
        "fails).", choices=FALLBACKS.names)

    def validate(self) -> None:
        check_fields(self, "data")
        get_loader(self.loader)
        require(self.train_split is not None or self.eval_split is not None,
                "data.train_split and data.eval_split are both null; set at least one")
        require(self.train_split is None or self.train_split != self.eval_split,
                f"data.eval_split must differ from data.train_split, both are {self.train_split!r}")
        self.template.validate()
        self._validate_source()

    def _validate_source(self) -> None:
        if self.loader == "arith":
            for key in ("path", "hub_id", "hub_config", "prompt_key", "answer_key"):
                require(getattr(self, key) is None, f"data.{key} is not used by loader 'arith'; set it to null")
            self.arith.validate()
            return
        spec = TABLE_SPECS[self.loader]
        require(not spec.needs_path or self.path is not None,
                "data.path must be set for loader 'file' (a .jsonl, .json, .parquet or .csv file)")
        require(not spec.needs_hub or self.hub_id is not None, "data.hub_id must be set for loader 'hub'")
        both_splits = self.train_split is not None and self.eval_split is not None
        require(self.path is None or not both_splits or SPLIT_SLOT in self.path,
                f"data.path {self.path!r} would serve both train and eval splits; put {SPLIT_SLOT} in it "
                "(e.g. gsm8k_{split}.jsonl) or set one of data.train_split/data.eval_split to null")


def data_config_from_dict(values) -> DataConfig:
    """A validated DataConfig from a plain dict or the Hydra `data` node."""
    if isinstance(values, DictConfig):
        values = OmegaConf.to_container(values, resolve=True)
    return build(DataConfig, values, "data")

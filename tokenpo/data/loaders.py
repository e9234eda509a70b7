"""Dataset loaders: a registry of names, each reading a local file (`data.path`) or a hub dataset into Examples.

Every table loader runs the same steps: read rows, resolve the problem/answer fields on the first row (a wrong
mapping stops at start-up naming the field and the file), parse each row, then drop and count empty problems,
empty answers, duplicate problems and rows lacking a field.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial
from itertools import chain, islice
from pathlib import Path
from typing import TYPE_CHECKING

from tokenpo.data.answers import gsm8k_final_answer, strip_dapo_wrapper
from tokenpo.data.arith import arith_splits
from tokenpo.data.example import Example, LoadReport
from tokenpo.data.files import MISSING, get_field, json_kind, read_rows
from tokenpo.data.prompts import prompt_token_ids
from tokenpo.errors import ConfigError
from tokenpo.registry import Registry
from tokenpo.rewards.extract import last_boxed

if TYPE_CHECKING:
    from tokenpo.data.config import DataConfig

SPLIT_SLOT = "{split}"
WHICH = ("train", "eval")
# Rows of each local data file read and parsed at start-up: a wrong mapping, a value of the wrong type or a broken
# line near the top stops the run in milliseconds whatever the file's size; later rows meet the same checks when the
# data loads, before the first step
CHECKED_ROWS = 1000

logger = logging.getLogger(__name__)


def answer_text(value) -> str:
    """A gold answer as text: numbers keep their written form (27.0 -> "27.0"; compared as numbers by the reward)."""
    if value is None:
        return ""
    if isinstance(value, (list, tuple)):
        return ", ".join(answer_text(item) for item in value)
    return str(value).strip()


def problem_text(value) -> str:
    if not isinstance(value, str):
        raise TypeError(f"holds {json_kind(value)}, not text")
    return value.strip()


def dapo_problem(value) -> str:
    """DAPO's `prompt` column is a list of chat messages: the user message, instruction wrapper removed."""
    if isinstance(value, str):
        return strip_dapo_wrapper(value)
    if not isinstance(value, (list, tuple)):
        raise TypeError(f"holds {json_kind(value)}, not a list of chat messages")
    user_messages = [m.get("content") or "" for m in value if isinstance(m, dict) and m.get("role") == "user"]
    return strip_dapo_wrapper(user_messages[-1]) if user_messages else ""


def boxed_answer(value) -> str:
    return (last_boxed(answer_text(value)) or "").strip()


def gsm8k_answer(value) -> str:
    return gsm8k_final_answer(answer_text(value)) or ""


# A field rule: (field path, parser from the raw value to text). Parsers return "" for "nothing usable".
FieldRule = tuple[str, Callable[[object], str]]


@dataclass(frozen=True)
class TableSpec:
    """How one dataset layout maps onto Examples. Empty rule tuples mean data.prompt_key/answer_key are required."""

    name: str
    hub_id: str | None = None
    hub_config: str | None = None
    prompt_rules: tuple[FieldRule, ...] = ()
    answer_rules: tuple[FieldRule, ...] = ()
    # meta name -> field path copied into Example.meta when present
    meta_fields: dict[str, str] = field(default_factory=dict)
    needs_path: bool = False
    needs_hub: bool = False


_PROBLEM_OR_QUESTION = (("problem", problem_text), ("question", problem_text))
_ANSWER = (("answer", answer_text),)
# MATH-500 carries an `answer` field; the full MATH set only a solution whose last \boxed{} is the answer.
_MATH_ANSWER = (("answer", answer_text), ("solution", boxed_answer))

TABLE_SPECS = {
    spec.name: spec
    for spec in (
        TableSpec("gsm8k", "openai/gsm8k", "main", (("question", problem_text),), (("answer", gsm8k_answer),)),
        TableSpec("math", "DigitalLearningGmbH/MATH-lighteval", "default", _PROBLEM_OR_QUESTION, _MATH_ANSWER,
                  {"level": "level", "subject": "subject", "type": "type", "unique_id": "unique_id"}),
        TableSpec("math500", "HuggingFaceH4/MATH-500", None, _PROBLEM_OR_QUESTION, _MATH_ANSWER,
                  {"level": "level", "subject": "subject", "unique_id": "unique_id"}),
        TableSpec("dapo_math_17k", "BytedTsinghua-SIA/DAPO-Math-17k", None, (("prompt", dapo_problem),),
                  (("reward_model.ground_truth", answer_text),),
                  {"original_prompt": "prompt.0.content", "data_source": "data_source", "index": "extra_info.index"}),
        TableSpec("aime24", "HuggingFaceH4/aime_2024", None, _PROBLEM_OR_QUESTION, _ANSWER, {"id": "id"}),
        TableSpec("aime25", "math-ai/aime25", None, _PROBLEM_OR_QUESTION, _ANSWER, {"id": "id"}),
        TableSpec("amc23", "math-ai/amc23", None, _PROBLEM_OR_QUESTION, _ANSWER, {"id": "id"}),
        TableSpec("file", needs_path=True),
        TableSpec("hub", needs_hub=True),
    )
}


def _resolve_rule(key: str, configured: str | None, rules: tuple[FieldRule, ...], first_row: dict,
                  spec: TableSpec, source: str) -> FieldRule:
    """The rule for data.<key>: the configured field (with the spec's parser for a known field name, plain text
    otherwise) or the first of the spec's default fields present in the first row."""
    fields = ", ".join(first_row)
    if configured is not None:
        if get_field(first_row, configured) is MISSING:
            raise ConfigError(f"data.{key} {configured!r} not found in {source} (fields: {fields})")
        parser = dict(rules).get(configured, problem_text if key == "prompt_key" else answer_text)
        return configured, parser
    if not rules:
        raise ConfigError(f"data.{key} must be set for loader {spec.name!r} (fields in {source}: {fields})")
    for rule in rules:
        if get_field(first_row, rule[0]) is not MISSING:
            return rule
    defaults = ", ".join(repr(path) for path, _ in rules)
    raise ConfigError(
        f"data.{key}: none of the {spec.name} loader's defaults ({defaults}) found in {source} (fields: {fields}); "
        f"set data.{key}"
    )


def _hub_rows(hub_id: str, hub_config: str | None, split: str) -> Iterable[dict]:
    try:
        import datasets  # imported here: only hub loading needs it, and it is an optional dependency
    except ImportError as error:
        raise ConfigError(
            f"data.hub_id {hub_id!r} needs the `datasets` package (pip install 'tokenpo[data]'); "
            "or set data.path to a local file"
        ) from error
    return datasets.load_dataset(hub_id, hub_config, split=split)


def _rows(cfg: DataConfig, spec: TableSpec, split: str) -> tuple[Iterable[dict], str]:
    """The split's rows and a label naming where they came from: data.path when set, the hub otherwise."""
    if cfg.path is not None:
        path = Path(cfg.path.replace(SPLIT_SLOT, split)).expanduser().resolve()
        return read_rows(path), str(path)
    hub_id = cfg.hub_id or spec.hub_id
    hub_config = cfg.hub_config if cfg.hub_id else (cfg.hub_config or spec.hub_config)
    return _hub_rows(hub_id, hub_config, split), f"hub:{hub_id}" + (f"[{hub_config}]" if hub_config else "")


def _parse(rule: FieldRule, row: dict, key: str, source: str, row_index: int):
    path, parser = rule
    value = get_field(row, path)
    if value is MISSING:
        return MISSING
    try:
        return parser(value)
    except TypeError as error:
        raise ConfigError(f"data.{key} {path!r} in {source} row {row_index} {error}") from error


def split_name(cfg: DataConfig, which: str) -> str | None:
    """The configured split name for `which` ("train" or "eval"); None when the config has no such split."""
    return cfg.train_split if which == "train" else cfg.eval_split


def load_table(spec: TableSpec, cfg: DataConfig, which: str) -> tuple[list[Example], LoadReport]:
    """Examples of one split of a table dataset, with the report of what was dropped and why."""
    split = split_name(cfg, which)
    rows, source = _rows(cfg, spec, split)
    return table_examples(rows, spec, cfg, split, source)


def table_examples(rows: Iterable[dict], spec: TableSpec, cfg: DataConfig, split: str,
                   source: str) -> tuple[list[Example], LoadReport]:
    """Examples of `rows` (from `source`) under the fields the first row resolves, with the dropped rows counted."""
    report = LoadReport(source=source, split=split)
    rows = iter(rows)
    first = next(rows, None)
    if first is None:
        return [], report
    prompt_rule = _resolve_rule("prompt_key", cfg.prompt_key, spec.prompt_rules, first, spec, source)
    answer_rule = _resolve_rule("answer_key", cfg.answer_key, spec.answer_rules, first, spec, source)
    examples: list[Example] = []
    seen: set[str] = set()
    for row_index, row in enumerate(chain([first], rows)):
        report.rows_read += 1
        problem = _parse(prompt_rule, row, "prompt_key", source, row_index)
        answer = _parse(answer_rule, row, "answer_key", source, row_index)
        if problem is MISSING or answer is MISSING:
            report.missing_field += 1
            continue
        if not problem:
            report.empty_problem += 1
            continue
        if not answer:
            report.empty_answer += 1
            continue
        # Duplicates are found on whitespace-normalised text (DAPO-Math-17k repeats each problem many times).
        dedup_key = " ".join(problem.split())
        if dedup_key in seen:
            report.duplicate_problem += 1
            continue
        seen.add(dedup_key)
        meta = {"row": row_index}
        for name, path in spec.meta_fields.items():
            value = get_field(row, path)
            if value is not MISSING:
                meta[name] = value
        examples.append(Example(uid=f"{cfg.name}/{split}/{row_index}", problem=problem, answer=answer, meta=meta))
    report.kept = len(examples)
    return examples, report


def check_local_files(cfg: DataConfig) -> Example | None:
    """Start-up check of data.path, so a bad file stops the run before torch is imported or a model loads: each
    split's file exists and holds rows, its first CHECKED_ROWS rows parse (the first holding the problem and answer
    fields, every problem text), and a file read whole there yields an example. Hub datasets are checked when they
    load. The training split's first example, where one was read."""
    if cfg.path is None or cfg.loader not in TABLE_SPECS:
        return None
    spec, first = TABLE_SPECS[cfg.loader], None
    for which in WHICH:
        split = split_name(cfg, which)
        if split is None:
            continue
        rows, source = _rows(cfg, spec, split)
        head = list(islice(rows, CHECKED_ROWS))
        if not head:
            raise ConfigError(f"data.path {source} holds no rows")
        examples, report = table_examples(head, spec, cfg, split, source)
        # a shorter head is the whole file: its load would find nothing to train or evaluate on
        if not examples and len(head) < CHECKED_ROWS:
            raise no_usable_examples(which, report)
        if which == "train" and examples:
            first = examples[0]
    return first


def first_example(cfg: DataConfig) -> Example | None:
    """The training split's first example where start-up reads it anyway or it costs nothing: a local file's (its
    check, `check_local_files`), a generated split's (the built-in arithmetic); None for a hub dataset, which loads
    later."""
    if cfg.loader in TABLE_SPECS:
        return check_local_files(cfg)
    examples, _ = get_loader(cfg.loader)(cfg, "train")
    return examples[0] if examples else None


def no_usable_examples(which: str, report: LoadReport) -> ConfigError:
    return ConfigError(f"data.{which}_split {report.split!r} has no usable examples ({report.summary()})")


def _load_arith(cfg: DataConfig, which: str) -> tuple[list[Example], LoadReport]:
    train, held_out = arith_splits(cfg.arith)
    examples = train if which == "train" else held_out
    source = f"arith(levels={cfg.arith.levels}, seed={cfg.arith.seed})"
    report = LoadReport(source=source, split=split_name(cfg, which), rows_read=len(examples), kept=len(examples))
    return examples, report


Loader = Callable[["DataConfig", str], tuple[list[Example], LoadReport]]
LOADERS = Registry("data.loader", {"arith": _load_arith} | {
    name: partial(load_table, spec) for name, spec in TABLE_SPECS.items()
})


def get_loader(name: str) -> Loader:
    return LOADERS.get(name)


def cap_prompt_lengths(examples: list[Example], cfg: DataConfig, tokenizer, report: LoadReport) -> list[Example]:
    """Apply data.max_prompt_tokens to a split: count the prompts (rendered with data.template) over the cap in
    `report`, and drop them (overlong_prompt drop), keep them to be truncated when encoded (truncate_*), or stop
    with a ConfigError (error)."""
    cap = cfg.max_prompt_tokens
    if not cap:
        return examples
    if tokenizer is None:
        raise ConfigError("data.max_prompt_tokens is set but the data was loaded without the model's tokenizer, "
                          "so prompt tokens cannot be counted; set data.max_prompt_tokens: null")
    lengths = [len(prompt_token_ids(ex.problem, tokenizer, cfg.template)) for ex in examples]
    overlong = {i for i, length in enumerate(lengths) if length > cap}
    report.max_prompt_tokens, report.overlong_prompt, report.overlong_action = cap, len(overlong), cfg.overlong_prompt
    if overlong and cfg.overlong_prompt == "error":
        raise ConfigError(
            f"data.max_prompt_tokens={cap}: {len(overlong)} of {len(examples)} prompts of {report.source} "
            f"[{report.split}] are longer (longest {max(lengths)} tokens); raise it or set data.overlong_prompt "
            "to drop, truncate_left or truncate_middle"
        )
    if cfg.overlong_prompt != "drop":
        return examples
    kept = [ex for i, ex in enumerate(examples) if i not in overlong]
    report.kept = len(kept)
    return kept


def load_split(cfg: DataConfig, which: str, seed: int, tokenizer=None) -> tuple[list[Example], LoadReport]:
    """The train or eval split (`which`) after the data.max_prompt_tokens and data.max_*_examples caps.

    The prompt cap counts tokens of `tokenizer` (required when the cap is set) and applies before the example cap,
    so a capped split still holds max_*_examples usable problems. The train cap is a seeded random subset (order
    kept); the eval cap keeps the first rows, so the same eval set is used whatever the run seed.
    """
    examples, report = get_loader(cfg.loader)(cfg, which)
    examples = cap_prompt_lengths(examples, cfg, tokenizer, report)
    cap = cfg.max_train_examples if which == "train" else cfg.max_eval_examples
    if cap is not None and len(examples) > cap:
        if which == "train":
            keep = sorted(random.Random(f"train-subset:{seed}").sample(range(len(examples)), cap))
            examples = [examples[i] for i in keep]
        else:
            examples = examples[:cap]
    return examples, report



def load_splits(cfg: DataConfig, seed: int, tokenizer=None,
                announce: bool = True) -> tuple[list[Example], list[Example]]:
    """(train, eval) examples; a split whose name is null comes back empty, a named split must yield examples.

    Each split's drop counts are logged in one line (a warning when rows were dropped) where `announce` (start-up's
    checks load the data before the trainer does: they leave the lines to it). `tokenizer` counts prompt tokens for
    data.max_prompt_tokens (see load_split).
    """
    splits = []
    for which in WHICH:
        if split_name(cfg, which) is None:
            splits.append([])
            continue
        examples, report = load_split(cfg, which, seed, tokenizer)
        if announce:
            logger.log(logging.WARNING if report.dropped else logging.INFO, "data %s: %s", cfg.name, report.summary())
        if not examples:
            raise no_usable_examples(which, report)
        splits.append(examples)
    return splits[0], splits[1]

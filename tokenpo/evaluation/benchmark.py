"""The benchmark a policy is evaluated on: its problems, its data config and stop tokens.

Shared by training-time evaluation (tokenpo.trainer.harness.loop) and `python -m tokenpo.evaluate`, so both score
the same problems with the same prompts.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

from tokenpo.data import DataConfig, Example, data_config_from_dict, load_splits
from tokenpo.data.config import data_keys_under
from tokenpo.errors import ConfigError
from tokenpo.evaluation.config import EvalConfig

log = logging.getLogger("tokenpo")


@dataclass(frozen=True)
class Benchmark:
    """A benchmark to evaluate: its eval settings, its problems (load_benchmark's) and the data config they come from
    (their prompt template and how their answers are read)."""

    config: EvalConfig
    examples: list[Example]
    data: DataConfig
    main: bool = True  # the run's `eval` benchmark (not an eval.extra one): its accuracy is the run's eval/accuracy

    @property
    def name(self) -> str:
        return self.config.name


def load_benchmark(eval_cfg: EvalConfig, data_cfg: DataConfig, seed: int, tokenizer,
                   data_eval: list[Example] | None = None, train: list[Example] | None = None,
                   data_key: str = "eval.data", announce: bool = True) -> tuple[list[Example], DataConfig]:
    """(the first eval.max_problems problems, the data config they come from).

    eval.data set: that dataset's eval split. eval.data null: the eval split of `data_cfg`; `data_eval` is that
    split when the caller already loaded it (the trainer loads it with the training split), else it is read here.
    `tokenizer` counts prompt tokens for the benchmark's data.max_prompt_tokens. Problems whose text is also in
    `train` (the run's training split) are left out before the cut, and counted in one log line. Errors in
    eval.data name it as `data_key` (eval.extra[i].data for an extra benchmark). `announce`: log the load lines
    (start-up's checks leave them to the trainer).
    """
    if eval_cfg.data is not None:
        with data_keys_under(data_key):
            data_cfg = data_config_from_dict(eval_cfg.data)
            _, examples = load_splits(data_cfg, seed, tokenizer, announce)
    elif data_eval is not None:
        examples = data_eval
    elif data_cfg.eval_split is None:
        raise ConfigError(f"eval.data is null and data.eval_split of {data_cfg.name!r} is null: nothing to evaluate "
                          "(pick a benchmark with eval=<name> or set data.eval_split)")
    else:
        # only the eval split: a benchmark run must not need (or download) the training split
        _, examples = load_splits(replace(data_cfg, train_split=None), seed, tokenizer, announce)
    if train:
        seen = {example.problem.strip() for example in train}
        unseen = [example for example in examples if example.problem.strip() not in seen]
        if len(unseen) < len(examples) and announce:
            log.info("eval %s: left out %d of %d problems that are also in the training split",
                     eval_cfg.name, len(examples) - len(unseen), len(examples))
        examples = unseen
    return examples[: eval_cfg.max_problems], data_cfg


def stop_token_ids(tokenizer, extra: tuple[int, ...]) -> tuple[int, ...]:
    """Token ids that end a response: the tokenizer's EOS and rollout.eos_tokens."""
    stop = {tokenizer.eos_token_id, *extra}
    return tuple(sorted(t for t in stop if t is not None))

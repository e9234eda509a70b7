"""Start-up, before the model loads: the run's real prompt lengths (its data under data.template, counted by the
model's tokenizer), and prompt + max_new_tokens checked against the model's context, so no response is cut
silently where the positions run out (vLLM's `length` stop, the hf engine decoding past the trained context).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tokenpo.data import Example, load_splits
from tokenpo.data.prompts import capped_prompt_ids
from tokenpo.errors import ConfigError
from tokenpo.rollout.engine import ENGINES

if TYPE_CHECKING:
    from tokenpo.config import TrainConfig

log = logging.getLogger("tokenpo")

RAISE_CONTEXT = ("docs/memory.md, 'Context length': cap prompts with data.max_prompt_tokens, or give the model more "
                 "positions with rope_scaling in its config.json where the model supports it")


@dataclass(frozen=True)
class PromptLengths:
    """Longest prompts in tokens, after data.template and data.max_prompt_tokens."""

    train: int
    eval: int  # over every benchmark (0 without one)


@dataclass(frozen=True)
class SequenceBudget:
    """One generation's sequence: its longest prompt and the response tokens allowed after it."""

    prompt_key: str  # the key that caps the prompt
    prompt_tokens: int
    new_tokens_key: str
    new_tokens: int

    @property
    def total(self) -> int:
        return self.prompt_tokens + self.new_tokens

    def describe(self) -> str:
        return (f"the longest prompt ({self.prompt_tokens} tokens, {self.prompt_key} caps it) + "
                f"{self.new_tokens_key}={self.new_tokens} = {self.total} tokens")


def longest_prompt(examples: list[Example], tokenizer, data_cfg) -> int:
    """Tokens of the longest prompt of `examples` as the trainer encodes it (tokenpo.data.prompts.capped_prompt_ids)."""
    return max((len(capped_prompt_ids(ex.problem, tokenizer, data_cfg)) for ex in examples), default=0)


def run_tokenizer(cfg: TrainConfig):
    """The policy's tokenizer, as tokenpo.models.loading.load_model loads it, without its weights, for counting
    prompt tokens (the tiny model's byte tokenizer without importing torch or transformers' model code)."""
    from tokenpo.models.tokenizers import load_tokenizer, tiny_tokenizer

    if cfg.model.source == "tiny":
        return tiny_tokenizer(cfg.model)
    from tokenpo.models.loading import resolve_pretrained_dir

    return load_tokenizer(cfg.model, resolve_pretrained_dir(cfg.model))


def run_prompt_lengths(cfg: TrainConfig) -> PromptLengths:
    """The longest training and evaluation prompts of this run, from its data and tokenizer (seconds: no weights)."""
    from tokenpo.evaluation.benchmark import load_benchmark

    tokenizer = run_tokenizer(cfg)
    # the load lines are the trainer's, which loads the data again: one line per split on the console
    train, train_eval = load_splits(cfg.data, cfg.seed, tokenizer, announce=False)
    longest_eval = 0
    for bench, key in zip(cfg.eval.benchmarks(), cfg.eval.data_keys()):
        examples, data_cfg = load_benchmark(bench, cfg.data, cfg.seed, tokenizer, train_eval, train, key,
                                            announce=False)
        longest_eval = max(longest_eval, longest_prompt(examples, tokenizer, data_cfg))
    return PromptLengths(train=longest_prompt(train, tokenizer, cfg.data), eval=longest_eval)


def generation_budgets(cfg: TrainConfig, prompts: PromptLengths) -> list[SequenceBudget]:
    """Every sequence the run generates: training rollouts, and each benchmark's (eval.max_new_tokens, null: the
    rollout's)."""
    budgets = [SequenceBudget("data.max_prompt_tokens", prompts.train, "rollout.max_new_tokens",
                              cfg.rollout.max_new_tokens)]
    for bench in cfg.eval.benchmarks() if prompts.eval else []:
        key = "eval.max_new_tokens" if bench.max_new_tokens is not None else "rollout.max_new_tokens"
        budgets.append(SequenceBudget("data.max_prompt_tokens", prompts.eval, key,
                                      bench.max_new_tokens or cfg.rollout.max_new_tokens))
    return budgets


def check_context(budgets: list[SequenceBudget], context: int, where: str, max_model_len: int | None) -> int:
    """The longest sequence of `budgets`; ConfigError (one line, naming both keys) when it exceeds the model's
    `context` positions or a set rollout.vllm.max_model_len."""
    longest = max(budgets, key=lambda budget: budget.total)
    if longest.total > context:
        raise ConfigError(f"context: {longest.describe()} exceed the model's {context} positions ({where}); lower "
                          f"{longest.new_tokens_key} or {longest.prompt_key} ({RAISE_CONTEXT})")
    if max_model_len is not None and longest.total > max_model_len:
        raise ConfigError(f"context: {longest.describe()} exceed rollout.vllm.max_model_len={max_model_len}, where "
                          f"vLLM would stop the response; raise it (up to the model's {context}) or lower "
                          f"{longest.new_tokens_key}")
    return longest.total


def check_run_context(cfg: TrainConfig, prompts: PromptLengths) -> int | None:
    """check_context for this run's model (its config.json, read offline) and engine; the longest sequence, or None
    where no config.json is found (a warning, as the memory plan does)."""
    from tokenpo.plan.architecture import model_architecture

    try:
        arch, where = model_architecture(cfg.model)
    except ConfigError as err:
        log.warning("context: not checked (%s)", err)
        return None
    max_model_len = cfg.rollout.vllm.max_model_len if ENGINES.trait(cfg.rollout.engine, "vllm_model") else None
    return check_context(generation_budgets(cfg, prompts), arch.context_length, where, max_model_len)


def check_token_budget(cfg: TrainConfig, prompts: PromptLengths) -> None:
    """ConfigError (one line) when trainer.micro_batch_tokens cannot hold the longest training sequence: the longest
    prompt + rollout.max_new_tokens (a longer row would run alone, over the budget the memory plan assumed)."""
    budget, longest = cfg.trainer.micro_batch_tokens, prompts.train + cfg.rollout.max_new_tokens
    if budget is not None and budget < longest:
        raise ConfigError(f"trainer.micro_batch_tokens={budget} is below the longest training sequence: a "
                          f"{prompts.train}-token prompt + rollout.max_new_tokens={cfg.rollout.max_new_tokens} = "
                          f"{longest}; raise it to at least {longest}")


def resolved_max_model_len(rollout, longest: int | None) -> int | None:
    """rollout.vllm.max_model_len to run with: as set; null (vLLM) becomes the run's longest sequence, as verl sets
    max_model_len from its prompt and response lengths, so vLLM never stops a response where the model's whole
    context (its default) would leave less room than the check allowed for."""
    if not ENGINES.trait(rollout.engine, "vllm_model") or rollout.vllm.max_model_len is not None or longest is None:
        return rollout.vllm.max_model_len
    return longest

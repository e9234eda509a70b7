"""Held-out evaluation during training: the run's benchmarks (eval, then eval.extra), each judged as
`tokenpo.evaluate` judges it (benchmark_reward), their metrics, sample tables and record files."""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tokenpo.config import benchmark_reward
from tokenpo.data import DataConfig, Example
from tokenpo.deepspeed import dist
from tokenpo.evaluation.benchmark import load_benchmark
from tokenpo.evaluation.config import EvalConfig
from tokenpo.evaluation.run import GenerateFn, evaluate, sample_lines
from tokenpo.logger.run_logger import RunLogger
from tokenpo.logger.samples import eval_rows
from tokenpo.rewards import RewardConfig, RewardScorer

log = logging.getLogger("tokenpo")


@dataclass(frozen=True)
class Benchmark:
    """One benchmark of the run: its eval config, its problems and the data config they come from."""

    config: EvalConfig
    examples: list[Example]
    data: DataConfig
    main: bool  # the run's `eval` benchmark (not an eval.extra one): its accuracy is the run's eval/accuracy

    @property
    def name(self) -> str:
        return self.config.name


@dataclass(frozen=True)
class EvalPoint:
    """A point whose records are written to files: before training, or after the last step."""

    stem: str  # the main benchmark's records go to <stem>.json, an extra one's to <stem>.<name>.json
    title: str  # heading of the sample answers on the console


BEFORE = EvalPoint("eval_before", "before training")
AFTER = EvalPoint("eval_after", "after training")


def load_benchmarks(eval_cfg: EvalConfig, data: DataConfig, seed: int, tokenizer, train_eval: list[Example],
                    train: list[Example]) -> list[Benchmark]:
    """eval and each eval.extra entry with at least one problem (problems of the training split left out)."""
    benchmarks = []
    for bench, key in zip(eval_cfg.benchmarks(), eval_cfg.data_keys()):
        examples, data_cfg = load_benchmark(bench, data, seed, tokenizer, train_eval, train, key)
        if examples:
            benchmarks.append(Benchmark(bench, examples, data_cfg, main=bench is eval_cfg))
    return benchmarks


@dataclass
class Evaluator:
    """What evaluating a benchmark reads: the generator, the prompts, the decoder and the training scorer."""

    generate: GenerateFn  # the rollout engine's generate
    prompt_ids: Callable[[Example, DataConfig], list[int]]  # a problem under a data config's template (PromptCache)
    decode: Callable[[list[list[int]]], list[str]]
    scorer: RewardScorer  # the training reward's workers: reused where a benchmark reads answers alike
    training_reward: RewardConfig  # how training answers are judged (cfg.reward_for(cfg.data))
    reward: RewardConfig  # reward.* as configured: each benchmark's reward is built from it (benchmark_reward)
    max_new_tokens: int  # rollout.max_new_tokens: a benchmark's response cap unless it sets its own
    stop_token_ids: list[int]  # the rollout's stop tokens (rollout.eos_tokens)
    seed: int

    def __call__(self, bench: Benchmark, step: int) -> tuple[dict[str, float], list[dict]]:
        """(eval/<name>/* metrics, and eval/accuracy for the main benchmark; per-problem records) at `step`."""
        reward = benchmark_reward(self.reward, bench.data)
        # the training scorer serves when the benchmark reads answers alike; otherwise workers for this evaluation
        scorer = contextlib.nullcontext(self.scorer) if reward == self.training_reward else RewardScorer(reward)
        with scorer as eval_scorer:
            metrics, records = evaluate(
                bench.examples, lambda ex: self.prompt_ids(ex, bench.data), self.generate, self.decode, eval_scorer,
                bench.config, (reward.answer_pattern, reward.fallback, reward.reasoning_tag),
                max_new_tokens=bench.config.max_new_tokens or self.max_new_tokens,
                stop_token_ids=self.stop_token_ids, seed=self.seed + step)
        flat = {f"eval/{bench.name}/{k}": v for k, v in metrics.items()}
        if bench.main:  # the main benchmark's accuracy is the run's headline number
            flat["eval/accuracy"] = metrics["accuracy"]
        return flat, records


def evaluate_benchmarks(evaluator: Evaluator, benchmarks: list[Benchmark], step: int, logger: RunLogger, *,
                        samples_rows: int, print_samples: int, run_dir: Path,
                        point: EvalPoint | None = None) -> dict[str, float]:
    """Every benchmark at this step: their metrics merged, their responses as sample tables (`samples_rows` rows);
    at a `point`, each one's records into its file and `print_samples` of the main one's answers on the console."""
    merged = {}
    for bench in benchmarks:
        metrics, records = evaluator(bench, step)
        merged.update(metrics)
        logger.log_samples(step, f"eval/{bench.name}", eval_rows(step, bench.name, records, samples_rows))
        if point is not None:
            if bench.main:
                report_samples(point.title, records, print_samples)
            write_eval(run_dir / (f"{point.stem}.json" if bench.main else f"{point.stem}.{bench.name}.json"),
                       metrics, records)
    return merged


def report_samples(title: str, records: list[dict], count: int) -> None:
    if dist.is_main() and count:
        log.info("sample answers %s:\n%s", title, "\n".join(sample_lines(records, count)))


def write_eval(path: Path, metrics: dict, records: list[dict]) -> None:
    if dist.is_main():
        path.write_text(json.dumps({"metrics": metrics, "records": records}, indent=1))

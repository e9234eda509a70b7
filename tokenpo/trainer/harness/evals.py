"""Held-out evaluation during training: the run's benchmarks (eval, then eval.extra), each judged as
`tokenpo.evaluate` judges it (benchmark_reward), their metrics, sample tables and record files."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

from tokenpo.data import DataConfig, Example
from tokenpo.deepspeed import dist
from tokenpo.evaluation.benchmark import Benchmark, load_benchmark
from tokenpo.evaluation.config import EvalConfig
from tokenpo.evaluation.run import TextSampler, evaluate_benchmark, sample_lines
from tokenpo.logger.run_logger import RunLogger
from tokenpo.logger.samples import eval_rows
from tokenpo.rewards import RewardConfig, RewardScorer
from tokenpo.rollout.config import RolloutConfig

log = logging.getLogger("tokenpo")


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
    """What evaluating a benchmark reads: the generator (as text), the training scorer and the run's settings."""

    sampler: TextSampler  # the rollout engine's generate, decoded
    scorer: RewardScorer  # the training reward's workers: reused where a benchmark reads answers alike
    reward: RewardConfig  # reward.* as configured: each benchmark's reward is built from it (benchmark_reward)
    rollout: RolloutConfig  # a benchmark's response cap (unless it sets its own) and stop tokens
    seed: int

    def __call__(self, bench: Benchmark, step: int) -> tuple[dict[str, float], list[dict]]:
        """(eval/<name>/* metrics, and eval/accuracy for the main benchmark; per-problem records) at `step`."""
        result = evaluate_benchmark(bench, self.reward, self.rollout, self.sampler, self.seed + step, self.scorer)
        flat = {f"eval/{bench.name}/{k}": v for k, v in result.metrics.items()}
        if bench.main:  # the main benchmark's accuracy is the run's headline number
            flat["eval/accuracy"] = result.metrics["accuracy"]
        return flat, result.records


def evaluate_benchmarks(evaluator: Evaluator, benchmarks: list[Benchmark], step: int, logger: RunLogger, *,
                        samples_rows: int, print_samples: int, run_dir: Path,
                        point: EvalPoint | None = None) -> dict[str, float]:
    """Every benchmark at this step: their metrics merged, their responses as sample tables (`samples_rows` rows);
    at a `point`, each one's records into its file and `print_samples` of the main one's answers on the console.
    A `final_only` benchmark is evaluated only at the AFTER point."""
    merged = {}
    for bench in benchmarks:
        if bench.config.final_only and point is not AFTER:
            continue
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

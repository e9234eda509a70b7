"""Evaluation during training (tokenpo.trainer.harness.evals): every benchmark's metrics merged, the main one's accuracy as
eval/accuracy, the records of a before/after point in their files, sample tables for every benchmark."""

from __future__ import annotations

import json
import logging

from tokenpo.data import DataConfig, Example
from tokenpo.evaluation.config import EvalConfig
from tokenpo.logger.config import LoggerConfig
from tokenpo.logger.run_logger import RunLogger
from tokenpo.evaluation.benchmark import Benchmark
from tokenpo.trainer.harness.evals import AFTER, BEFORE, evaluate_benchmarks
from tokenpo.trainer.harness.identity import RunIdentity


def record(uid: str, verdict: str) -> dict:
    return {"uid": uid, "problem": f"problem {uid}", "gold": "1",
            "greedy": {"response": f"answer {uid}", "verdict": verdict, "answer": "1"}}


def judged(bench: Benchmark, step: int) -> tuple[dict[str, float], list[dict]]:
    """Stands in for the Evaluator: the main benchmark half right, the extra one all wrong."""
    accuracy = 0.5 if bench.main else 0.0
    metrics = {f"eval/{bench.name}/accuracy": accuracy}
    if bench.main:
        metrics["eval/accuracy"] = accuracy
    return metrics, [record(f"{bench.name}-{step}", "correct" if bench.main else "wrong")]


def benchmarks() -> list[Benchmark]:
    main = EvalConfig(name="arith")
    extra = EvalConfig(name="math500")
    return [Benchmark(main, [Example("a", "1 + 0?", "1")], DataConfig(), main=True),
            Benchmark(extra, [Example("b", "0 + 1?", "1")], DataConfig(), main=False)]


def test_a_point_writes_each_benchmarks_records_and_prints_the_main_ones_samples(tmp_path, caplog):
    logger = RunLogger(LoggerConfig(mode="disabled", samples_every=1), RunIdentity(tmp_path, "r", "g", {}),
                       enabled=True)
    with caplog.at_level(logging.INFO, logger="tokenpo"):
        merged = evaluate_benchmarks(judged, benchmarks(), 3, logger, samples_rows=8, print_samples=1,
                                     run_dir=tmp_path, point=AFTER)
    assert merged == {"eval/arith/accuracy": 0.5, "eval/accuracy": 0.5, "eval/math500/accuracy": 0.0}
    main, extra = (json.loads((tmp_path / name).read_text()) for name in ("eval_after.json", "eval_after.math500.json"))
    assert main["records"][0]["uid"] == "arith-3" and extra["records"][0]["uid"] == "math500-3"
    assert [m for m in caplog.messages if m.startswith("sample answers after training:")]
    tables = [json.loads(line)["table"] for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert tables == ["eval/arith", "eval/math500"]


def test_between_the_points_nothing_is_written_but_the_tables(tmp_path):
    logger = RunLogger(LoggerConfig(mode="disabled", samples_every=1), RunIdentity(tmp_path, "r", "g", {}),
                       enabled=True)
    evaluate_benchmarks(judged, benchmarks(), 10, logger, samples_rows=8, print_samples=1, run_dir=tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["samples.jsonl"]


def test_a_final_only_benchmark_runs_only_after_the_last_step(tmp_path):
    logger = RunLogger(LoggerConfig(mode="disabled"), RunIdentity(tmp_path, "r", "g", {}), enabled=True)
    main, extra = benchmarks()
    final_only = Benchmark(EvalConfig(name="transfer", final_only=True), extra.examples, extra.data, main=False)
    kwargs = dict(samples_rows=0, print_samples=0, run_dir=tmp_path)
    before = evaluate_benchmarks(judged, [main, final_only], 0, logger, point=BEFORE, **kwargs)
    between = evaluate_benchmarks(judged, [main, final_only], 3, logger, **kwargs)
    after = evaluate_benchmarks(judged, [main, final_only], 6, logger, point=AFTER, **kwargs)
    assert sorted(before) == sorted(between) == ["eval/accuracy", "eval/arith/accuracy"]
    assert after["eval/transfer/accuracy"] == 0.0 and (tmp_path / "eval_after.transfer.json").exists()
    assert not (tmp_path / "eval_before.transfer.json").exists()

import csv
import math

import pytest

from tokenpo.compare.runs import Run
from tokenpo.compare.table import markdown_report, summarize_group, with_baseline_ratios, write_csv


def run(evals, seconds_per_step):
    """Steps 1..len(evals); training accuracy 0.2 * step; eval on every step."""
    records = [
        {"step": float(step), "time/elapsed_s": step * seconds_per_step, "accuracy": 0.2 * step, "eval/accuracy": value}
        for step, value in enumerate(evals, start=1)
    ]
    return Run(f"run{seconds_per_step}", {}, records)


def test_target_on_training_metric_counts_steps_and_seconds():
    # accuracy 0.2 * step first reaches 0.5 at step 3: 3 s and 6 s
    summary = summarize_group("g", [run([0.1] * 4, 1.0), run([0.1] * 4, 2.0)], "accuracy", 0.5)
    assert (summary.n_reached, summary.steps_to_target_mean, summary.time_to_target_s_mean) == (2, 3.0, 4.5)


def test_unreached_target_and_missing_baseline_value_stay_empty(tmp_path):
    never = summarize_group("never", [run([0.25, 0.5], 1.0)], "eval/accuracy", 0.99)
    once = summarize_group("once", [run([0.25, 1.0], 1.0)], "eval/accuracy", 0.99)
    assert (never.n_reached, never.steps_to_target_mean, never.time_to_target_s_mean) == (0, None, None)
    # one run: std is 0, not undefined
    assert (never.final_eval_mean, never.final_eval_std, never.best_eval_mean) == (0.5, 0.0, 0.5)
    summaries = with_baseline_ratios([never, once], "never")
    assert summaries[1].steps_ratio_vs_baseline is None
    write_csv(summaries, tmp_path / "summary.csv")
    with (tmp_path / "summary.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert rows[0]["steps_to_target_mean"] == "" and rows[1]["steps_to_target_mean"] == "2.0"
    table = markdown_report(summaries, [], "eval/accuracy", 0.99, "never")
    assert "| never | 1 | 0.500 ± 0.000 [n/a: 1 run] | 0.500 ± 0.000 [n/a: 1 run] | 0/1 | — | — | — | — | — | — |" in table
    assert "| once | 1 | 1.000 ± 0.000 [n/a: 1 run] | 1.000 ± 0.000 [n/a: 1 run] | 1/1 | 2.0 | 2.0 | — | — | — | — |" in table
    assert "Missing" not in table


def test_ratios_from_groups_where_some_runs_missed_the_target_are_marked():
    # baseline: 2 runs, both reach 0.99 at step 2; fast: one run reaches it at step 1, the other never
    base = summarize_group("base", [run([0.5, 1.0], 1.0), run([0.5, 1.0], 1.0)], "eval/accuracy", 0.99)
    fast = summarize_group("fast", [run([1.0, 1.0], 1.0), run([0.5, 0.5], 1.0)], "eval/accuracy", 0.99)
    summaries = with_baseline_ratios([base, fast], "base")
    assert (summaries[1].n_reached, summaries[1].steps_ratio_vs_baseline) == (1, 0.5)
    table = markdown_report(summaries, [], "eval/accuracy", 0.99, "base")
    assert "| base | 2 | 1.000 ± 0.000 [1.000, 1.000] | 1.000 ± 0.000 [1.000, 1.000] | 2/2 | 2.0 | 2.0 | — | 1.00 | 1.00 | — |" in table
    # 0.75 ± t_{0.975, 1} * 0.3536 / sqrt(2) = 0.75 ± 12.706 / 4
    assert "| fast | 2 | 0.750 ± 0.354 [-2.427, 3.927] | 0.750 ± 0.354 [-2.427, 3.927] | 1/2 | 1.0 | 1.0 | — | 0.50* | 0.50* | — |" in table
    assert "\\* ratio of means over the runs that reached the target only" in table


def test_final_best_and_tokens_to_target_follow_the_target_metric():
    # pass@4 per step 0.5, 0.75, 0.625 (final 0.625, best 0.75); 300 generated tokens per step
    runs = [
        Run(f"r{seed}", {}, [
            {"step": float(step), "eval/accuracy": 0.1, "eval/b/pass@4": value + 0.125 * seed,
             "tokens/generated_total": 300.0 * step}
            for step, value in enumerate([0.5, 0.75, 0.625], start=1)
        ])
        for seed in (0, 1)
    ]
    summary = summarize_group("g", runs, "eval/b/pass@4", 0.7)
    assert (summary.final_eval_mean, summary.best_eval_mean) == (0.6875, 0.8125)
    # two finals 0.625, 0.75: 0.6875 ± 12.706... * 0.0884 / sqrt(2) = 0.6875 ± 0.0625 * tan(0.475 pi)
    half = 0.0625 * math.tan(0.475 * math.pi)
    assert (summary.final_eval_ci95_low, summary.final_eval_ci95_high) == (
        pytest.approx(0.6875 - half, abs=1e-9), pytest.approx(0.6875 + half, abs=1e-9))
    # seed 0 (0.5, 0.75, ...) and seed 1 (0.625, 0.875, ...) both first reach 0.7 at step 2: 600 tokens
    assert (summary.n_reached, summary.tokens_to_target_mean) == (2, 600.0)
    base = summarize_group("base", runs[:1], "eval/b/pass@4", 0.5)  # reaches 0.5 at step 1: 300 tokens
    assert with_baseline_ratios([summary, base], "base")[0].tokens_ratio_vs_baseline == 2.0

import csv

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
    assert "| never | 1 | 0.500 ± 0.000 | 0.500 ± 0.000 | 0/1 | — | — | — | — |" in table
    assert "| once | 1 | 1.000 ± 0.000 | 1.000 ± 0.000 | 1/1 | 2.0 | 2.0 | — | — |" in table
    assert "Missing" not in table


def test_ratios_from_groups_where_some_runs_missed_the_target_are_marked():
    # baseline: 2 runs, both reach 0.99 at step 2; fast: one run reaches it at step 1, the other never
    base = summarize_group("base", [run([0.5, 1.0], 1.0), run([0.5, 1.0], 1.0)], "eval/accuracy", 0.99)
    fast = summarize_group("fast", [run([1.0, 1.0], 1.0), run([0.5, 0.5], 1.0)], "eval/accuracy", 0.99)
    summaries = with_baseline_ratios([base, fast], "base")
    assert (summaries[1].n_reached, summaries[1].steps_ratio_vs_baseline) == (1, 0.5)
    table = markdown_report(summaries, [], "eval/accuracy", 0.99, "base")
    assert "| base | 2 | 1.000 ± 0.000 | 1.000 ± 0.000 | 2/2 | 2.0 | 2.0 | 1.00 | 1.00 |" in table
    assert "| fast | 2 | 0.750 ± 0.354 | 0.750 ± 0.354 | 1/2 | 1.0 | 1.0 | 0.50* | 0.50* |" in table
    assert "\\* ratio of means over the runs that reached the target only" in table

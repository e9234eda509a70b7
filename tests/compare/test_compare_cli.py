"""End to end through main([...]) on the synthetic multirun; table values checked against hand-computed ones."""

import csv
import math

import pytest

from tokenpo.compare import main

GRPO, DAPO = "algorithm=grpo", "algorithm=dapo"


def read_summary(out_dir):
    with (out_dir / "summary.csv").open() as handle:
        return {row["group"]: row for row in csv.DictReader(handle)}


def test_summary_csv_matches_hand_computed_values(compared, out_of):
    root, _, code, _ = compared
    assert code == 0
    rows = read_summary(out_of(root))
    assert list(rows) == [DAPO, GRPO]
    grpo, dapo = rows[GRPO], rows[DAPO]
    # grpo finals 0.5, 0.75, 0.25; bests 0.5, 1.0, 0.25 (mean 7/12, deviations -1/12, 5/12, -4/12)
    assert int(grpo["n_runs"]) == 3
    assert float(grpo["final_eval_mean"]) == 0.5 and float(grpo["final_eval_std"]) == 0.25
    # 95 % t-interval: 0.5 ± t_{0.975, 2} * 0.25 / sqrt(3), t_{0.975, 2} = 0.95 / sqrt(2 * 0.975 * 0.025)
    half = 0.95 / math.sqrt(2 * 0.975 * 0.025) * 0.25 / math.sqrt(3)
    assert float(grpo["final_eval_ci95_low"]) == pytest.approx(0.5 - half, abs=1e-9)
    assert float(grpo["final_eval_ci95_high"]) == pytest.approx(0.5 + half, abs=1e-9)
    assert float(grpo["best_eval_mean"]) == pytest.approx(7 / 12, rel=1e-12)
    assert float(grpo["best_eval_std"]) == pytest.approx(math.sqrt(42 / 144 / 2), rel=1e-12)
    # grpo: seed 0 reaches 0.5 at step 4 (40 s), seed 1 at step 2 (20 s), seed 2 never
    assert int(grpo["n_reached"]) == 2
    assert float(grpo["steps_to_target_mean"]) == 3.0 and float(grpo["time_to_target_s_mean"]) == 30.0
    assert float(grpo["steps_ratio_vs_baseline"]) == 1.0 and float(grpo["time_ratio_vs_baseline"]) == 1.0
    # 1000 generated tokens per step: 4000 and 2000
    assert float(grpo["tokens_to_target_mean"]) == 3000.0
    # dapo finals = bests 0.75, 0.5, 0.75 (mean 2/3, deviations 1/12, -2/12, 1/12); reaches at steps 2, 2, 4 (10, 10, 20 s)
    assert float(dapo["final_eval_mean"]) == pytest.approx(2 / 3, rel=1e-12)
    assert float(dapo["final_eval_std"]) == pytest.approx(math.sqrt(6 / 144 / 2), rel=1e-12)
    assert float(dapo["best_eval_mean"]) == float(dapo["final_eval_mean"])
    assert int(dapo["n_reached"]) == 3
    assert float(dapo["steps_to_target_mean"]) == pytest.approx(8 / 3, rel=1e-12)
    assert float(dapo["time_to_target_s_mean"]) == pytest.approx(40 / 3, rel=1e-12)
    assert float(dapo["steps_ratio_vs_baseline"]) == pytest.approx(8 / 9, rel=1e-12)
    assert float(dapo["time_ratio_vs_baseline"]) == pytest.approx(4 / 9, rel=1e-12)
    # dapo generates 2000 tokens per step: fewer steps but more tokens to the target than grpo
    assert float(dapo["tokens_to_target_mean"]) == pytest.approx(16000 / 3, rel=1e-12)
    assert float(dapo["tokens_ratio_vs_baseline"]) == pytest.approx(16 / 9, rel=1e-12)


def test_markdown_table_is_printed_and_written(compared, out_of):
    root, stdout, _, _ = compared
    report = (out_of(root) / "summary.md").read_text()
    assert stdout.startswith(report)
    # the baseline (grpo) reached the target in 2 of 3 runs: dapo's ratios are marked, the baseline's own are not
    assert ("| algorithm=dapo | 3 | 0.667 ± 0.144 [0.308, 1.025] | 0.667 ± 0.144 [0.308, 1.025] | 3/3 | 2.7 | 13.3 | "
            "5333 | 0.89* | 0.44* | 1.78* |") in report
    assert ("| algorithm=grpo | 3 | 0.500 ± 0.250 [-0.121, 1.121] | 0.583 ± 0.382 [-0.365, 1.532] | 2/3 | 3.0 | 30.0 | "
            "3000 | 1.00 | 1.00 | 1.00 |") in report


def test_significance_vs_baseline_is_paired_by_seed(compared, out_of):
    root, _, _, _ = compared
    significance = (out_of(root) / "significance.md").read_text()
    assert f"## Significance vs {GRPO}\n\n{significance}" in (out_of(root) / "summary.md").read_text()
    # finals dapo - grpo per seed 0.25, -0.25, 0.5: t = (1/6) / sqrt(7/144) on 2 df, p = 1 - t / sqrt(2 + t^2)
    t = (1 / 6) / math.sqrt(7 / 144)
    p = 1 - t / math.sqrt(2 + t * t)
    assert f"| {DAPO} | 3 vs 3 | paired (n=3) | +0.167 [-0.782, +1.115] | {p:.3f} | {p:.3f} | not significant |" in significance
    with (out_of(root) / "significance.csv").open() as handle:
        rows = {row["value"]: row for row in csv.DictReader(handle)}
    assert (rows["final"]["group"], rows["final"]["baseline"], rows["final"]["test"]) == (DAPO, GRPO, "paired (n=3)")
    assert float(rows["final"]["p"]) == pytest.approx(p, abs=1e-12) == float(rows["final"]["p_holm"])
    # bests dapo - grpo per seed 0.25, -0.5, 0.5
    assert float(rows["best"]["difference"]) == pytest.approx(1 / 12, abs=1e-12)


def test_missing_and_skipped_data_is_reported_not_fatal(compared, out_of):
    root, _, _, _ = compared
    report = (out_of(root) / "summary.md").read_text()
    assert f"- run {root / '6'}: no metrics.jsonl yet" in report
    assert f"- run {root / '5'}: skipped 1 unreadable line(s)" in report
    assert "- group algorithm=dapo: no kl/old values" in report


def test_wandb_logs_figures_and_table_to_one_run(compared, out_of):
    root, _, _, calls = compared
    assert calls["init"]["project"] == "proj" and calls["init"]["group"] == "multirun"
    assert calls["log"]["eval_accuracy_vs_time"] == ("image", str(out_of(root) / "eval_accuracy_vs_time.png"))
    _, columns, data = calls["log"]["summary"]
    assert columns[0] == "group" and [row[0] for row in data] == [DAPO, GRPO]
    assert calls["finished"]


def test_errors_are_one_line_and_non_zero(multirun, tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main([str(tmp_path / "missing")]) == 1
    assert main([str(tmp_path / "empty")]) == 1
    assert main([str(multirun / "6")]) == 1
    assert main([str(multirun), "--baseline", "algorithm=gtpo"]) == 1
    errors = capsys.readouterr().err.strip().splitlines()
    assert len(errors) == 4 and all(line.startswith("tokenpo-compare: ") for line in errors)
    assert "no such directory" in errors[0] and "no run dirs" in errors[1]
    assert "has metrics yet" in errors[2] and "matches 0 groups" in errors[3]
    assert not (multirun / "compare").exists()


def test_no_figures_writes_the_tables_for_another_target_metric(multirun, tmp_path, capsys):
    out = tmp_path / "reward"
    assert main([str(multirun), "--baseline", "algorithm=grpo", "--target-metric", "reward/mean", "--no-figures",
                 "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["significance.csv", "significance.md", "summary.csv", "summary.md"]
    assert "final reward/mean" in (out / "significance.md").read_text()
    assert "wrote 0 figures" in capsys.readouterr().out


def test_a_margin_must_be_positive_and_needs_a_baseline(multirun, capsys):
    for argv in ([str(multirun), "--baseline", GRPO, "--margin", "-0.05"], [str(multirun), "--margin", "0.05"]):
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        assert exit_.value.code == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert "--margin must be > 0" in errors[0] and "--margin needs --baseline" in errors[1]


def test_a_margin_adds_its_verdict_to_the_significance_table(multirun, tmp_path, capsys):
    out = tmp_path / "margin"
    assert main([str(multirun), "--baseline", GRPO, "--margin", "0.05", "--no-figures", "--out", str(out)]) == 0
    text = (out / "significance.md").read_text()
    assert "Equivalence margin ±0.05" in text and "within ±0.05" in text

"""scripts/export_study_data.py: run dirs -> one CSV row per run with the final evaluation and the last step's
metrics, and the committed per-run CSVs in docs/data/ reproduce the committed study summaries they stand behind."""

from __future__ import annotations

import csv
import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SPEC = importlib.util.spec_from_file_location("export_study_data", REPO / "scripts" / "export_study_data.py")
export_study_data = importlib.util.module_from_spec(SPEC)
# dataclasses look their module up in sys.modules while the class is built
sys.modules[SPEC.name] = export_study_data
SPEC.loader.exec_module(export_study_data)


def fake_run(root: Path, algorithm: str, seed: int, steps: list[dict], eval_after: dict) -> None:
    run = root / f"{algorithm}_{seed}"
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "overrides.yaml").write_text(f"- algorithm={algorithm}\n- seed={seed}\n")
    (run / "metrics.jsonl").write_text("".join(json.dumps(step) + "\n" for step in steps))
    (run / "eval_after.json").write_text(json.dumps({"metrics": eval_after, "records": []}))


def test_a_run_row_holds_its_final_evaluation_and_last_step(tmp_path):
    # step 2 is not an eval step: the final held-out score lives only in eval_after.json
    steps = [{"step": 0, "eval/accuracy": 0.25}, {"step": 1, "entropy/mean": 2.0, "kl/ref": 0.0},
             {"step": 2, "entropy/mean": 1.5, "kl/ref": 0.125}]
    fake_run(tmp_path / "study", "grpo", 0, steps, {"eval/accuracy": 0.5})
    fake_run(tmp_path / "study", "dapo", 0, steps, {"eval/accuracy": 0.75})
    out = tmp_path / "study.csv"
    assert export_study_data.main(["export", str(tmp_path / "study"), "--out", str(out)]) == 0
    rows = {row["group"]: row for row in csv.DictReader(out.open())}
    assert sorted(rows) == ["algorithm=dapo", "algorithm=grpo"]
    grpo = rows["algorithm=grpo"]
    assert (grpo["seed"], grpo["step"], grpo["held_out"], grpo["entropy"], grpo["kl_ref"]) == ("0", "2", "0.5", "1.5", "0.125")
    assert grpo["transfer"] == ""  # never logged


def test_every_eval_gives_one_row_per_evaluated_step(tmp_path):
    steps = [{"step": 0, "eval/accuracy": 0.25}, {"step": 1, "entropy/mean": 2.0},
             {"step": 2, "entropy/mean": 1.5, "eval/accuracy": 0.5}]
    fake_run(tmp_path / "study", "grpo", 0, steps, {"eval/accuracy": 0.5})
    out = tmp_path / "long.csv"
    export_study_data.main(["export", str(tmp_path / "study"), "--out", str(out), "--every-eval"])
    assert [(row["step"], row["held_out"], row["entropy"]) for row in csv.DictReader(out.open())] == [
        ("0", "0.25", ""), ("2", "0.5", "1.5")]


def test_table_pairs_seeds_against_the_baseline():
    values = {"algorithm=grpo": {"0": 0.5, "1": 0.6, "2": 0.4}, "algorithm=dapo": {"0": 0.6, "1": 0.8, "2": 0.5}}
    lines = export_study_data.table_lines(values, "algorithm=grpo")
    # differences 0.1, 0.2, 0.1: mean 0.133, sd 0.0577, t = 4.0 on 2 df, two-sided p = 0.057
    assert lines[0] == "algorithm=grpo: n=3 0.500 ± 0.100 [0.252, 0.748]"
    assert lines[1].startswith("algorithm=dapo: n=3 0.633 ± 0.153")
    assert "- algorithm=grpo: +0.133 [-0.010, +0.277], paired (n=3), p = 0.057, Holm 0.057" in lines[1]


@pytest.mark.parametrize("per_run, summary", [
    ("study.csv", "data/study/summary.csv"),
    ("study_lora.csv", "data/study/lora/summary.csv"),
    ("entropy_study.csv", "data/entropy_study/summary.csv"),
    ("entropy_study.csv", "data/entropy_study/vs_dapo/summary.csv"),
])
def test_committed_per_run_data_reproduce_the_committed_summary(per_run, summary):
    values = export_study_data.read_column(REPO / "docs" / "data" / per_run, "held_out")
    rows = {row["group"]: row for row in csv.DictReader((REPO / "docs" / summary).open())}
    assert sorted(values) == sorted(rows)
    for group, by_seed in values.items():
        finals = list(by_seed.values())
        mean = sum(finals) / len(finals)
        std = math.sqrt(sum((x - mean) ** 2 for x in finals) / (len(finals) - 1))
        assert int(rows[group]["n_runs"]) == len(finals)
        assert mean == pytest.approx(float(rows[group]["final_eval_mean"]), abs=1e-12)
        assert std == pytest.approx(float(rows[group]["final_eval_std"]), abs=1e-12)


@pytest.mark.parametrize("per_run, tests, baseline", [
    ("study.csv", "data/study/significance.csv", "algorithm=grpo"),
    ("entropy_study.csv", "data/entropy_study/significance.csv", "algorithm=grpo"),
    ("entropy_study.csv", "data/entropy_study/vs_dapo/significance.csv", "algorithm=dapo"),
])
def test_committed_per_run_data_reproduce_the_committed_paired_tests(per_run, tests, baseline):
    values = export_study_data.read_column(REPO / "docs" / "data" / per_run, "held_out")
    lines = dict(line.split(": ", 1) for line in export_study_data.table_lines(values, baseline))
    for row in csv.DictReader((REPO / "docs" / tests).open()):
        if row["value"] == "final" and row["p_holm"]:  # rows without a test (no spread) have no p
            difference = float(row["difference"])
            p_holm = float(row["p_holm"])
            assert f"{difference:+.3f} [{float(row['ci95_low']):+.3f}, {float(row['ci95_high']):+.3f}]" in lines[row["group"]]
            assert f"Holm {p_holm:.3f}" in lines[row["group"]]

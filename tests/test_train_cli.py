"""`python -m tokenpo.train` end to end in subprocesses: a 2-step run, a 2-algorithm x 2-seed sweep compared
with tokenpo.compare, and bad overrides.

Module-level imports stay light: the reward workers of the trained runs import this module for `even_length`.
"""

from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# small enough for 2 CPU cores: 4 prompts x 4 responses of 8 tokens, 4 held-out problems
SMALL = ["model=tiny", "logger.mode=disabled", "rollout.max_new_tokens=8", "data.prompts_per_step=4",
         "eval.max_problems=4", "reward.num_workers=1", "reward.fn=test_train_cli:even_length"]
STEP_KEYS = ("step", "reward/mean", "accuracy", "entropy/mean", "response_length/mean", "kl/ref", "loss", "grad_norm",
             "lr", "timing/generate_s", "timing/update_s", "timing/step_s", "throughput/tokens_per_s")


def even_length(response: str, gold: str) -> bool:
    """Reward for the runs here: a random model's responses differ in length, so every group has both rewards and
    each step a nonzero policy gradient (the arithmetic check would give a random model all-zero rewards)."""
    return len(response) % 2 == 0


def train(*overrides: str, timeout: float = 240) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(Path(__file__).parent),
                                                                     os.environ.get("PYTHONPATH")])))
    return subprocess.run([sys.executable, "-m", "tokenpo.train", *overrides], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)


def read_metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def test_two_step_run_logs_every_metric_and_updates_the_model(tmp_path):
    run_dir = tmp_path / "run"
    proc = train(*SMALL, "trainer.max_steps=2", f"hydra.run.dir={run_dir}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = read_metrics(run_dir)
    assert [line["step"] for line in lines] == [0, 1, 2]
    assert set(lines[0]) >= {"step", "eval/accuracy"}
    for line in lines[1:]:
        missing = [key for key in STEP_KEYS if key not in line]
        assert not missing, f"step {line['step']} lacks {missing}"
        assert all(math.isfinite(line[key]) for key in STEP_KEYS)
        assert 0 <= line["accuracy"] <= 1 and line["response_length/mean"] <= 8 and line["lr"] > 0
    assert 0 <= lines[-1]["eval/accuracy"] <= 1 and "eval/accuracy" not in lines[1]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["eval_after"] == lines[-1]["eval/accuracy"]
    eval_after = json.loads((run_dir / "eval_after.json").read_text())
    assert eval_after["metrics"]["eval/arith/num_problems"] == 4 and len(eval_after["records"]) == 4
    assert_trained_from_seed(run_dir / "final", seed=0, lr=lines[-1]["lr"])


def assert_trained_from_seed(final: Path, seed: int, lr: float) -> None:
    """final/ holds the seed's tiny model moved by two small optimiser steps: every tensor within a few lr of
    its initial value (a different init differs by ~0.02), and some tensor moved."""
    import torch
    from transformers import AutoModelForCausalLM

    from tokenpo.models.config import ModelConfig
    from tokenpo.models.loading import build_tiny_model

    trained = AutoModelForCausalLM.from_pretrained(final, dtype=torch.float32).state_dict()
    initial = build_tiny_model(ModelConfig(name="tiny", source="tiny"), trained["model.embed_tokens.weight"].shape[0],
                               seed).state_dict()
    assert initial.keys() == trained.keys()
    moved = {name: (trained[name] - initial[name]).abs().max().item() for name in initial}
    assert max(moved.values()) < 10 * lr, moved
    assert sum(value > 0 for value in moved.values()) >= len(moved) // 2, moved


def test_algorithm_by_seed_sweep_then_compare(tmp_path):
    """The issue's check: a 2-algorithm x 2-seed multirun on the tiny model, then tokenpo.compare on its folder."""
    sweep = tmp_path / "sweep"
    proc = train("-m", *SMALL, "trainer.max_steps=1", "algorithm=grpo,dapo", "seed=0,1", f"hydra.sweep.dir={sweep}",
                 timeout=480)
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = sorted(path for path in sweep.iterdir() if path.is_dir())
    assert [path.name for path in runs] == ["0", "1", "2", "3"]
    metrics = {}
    for run in runs:
        overrides = (run / ".hydra" / "overrides.yaml").read_text()
        algorithm, seed = (next(word.split("=")[1] for word in overrides.split() if word.startswith(key + "="))
                           for key in ("algorithm", "seed"))
        lines = read_metrics(run)
        assert [line["step"] for line in lines] == [0, 1] and "eval/accuracy" in lines[-1]
        assert (run / "final" / "config.json").is_file()
        metrics[algorithm, seed] = lines
    assert sorted(metrics) == [("dapo", "0"), ("dapo", "1"), ("grpo", "0"), ("grpo", "1")]
    # different seeds: different tiny models, so different entropies of their samples
    assert metrics["grpo", "0"][1]["entropy/mean"] != metrics["grpo", "1"][1]["entropy/mean"]

    out = tmp_path / "compare"
    proc = subprocess.run([sys.executable, "-m", "tokenpo.compare", str(sweep), "--baseline", "algorithm=grpo",
                           "--out", str(out)], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with (out / "summary.csv").open() as handle:
        rows = {row["group"]: row for row in csv.DictReader(handle)}
    assert sorted(rows) == ["algorithm=dapo", "algorithm=grpo"]
    for algorithm, row in rows.items():
        finals = [metrics[algorithm.split("=")[1], seed][-1]["eval/accuracy"] for seed in ("0", "1")]
        assert int(row["n_runs"]) == 2
        assert float(row["final_eval_mean"]) == pytest.approx(sum(finals) / 2)
    for name in ("eval_accuracy", "entropy_mean", "reward_mean", "clip_frac"):
        for x_axis in ("step", "time"):
            assert (out / f"{name}_vs_{x_axis}.png").stat().st_size > 10_000
    assert "| algorithm=grpo | 2 |" in (out / "summary.md").read_text()


BAD = [
    (["rollout.group_size=-2"], "rollout.group_size"),
    (["model=tiny", "model.source=local", "model.path=/nonexistent"], "model.path"),
]


def test_bad_overrides_fail_fast_with_one_line_naming_the_key(tmp_path):
    # started together: each spends most of its few seconds importing; Hydra makes the run dir before the job
    # starts, so it goes to tmp_path
    procs = [subprocess.Popen([sys.executable, "-m", "tokenpo.train", "logger.mode=disabled", *overrides,
                               f"hydra.run.dir={tmp_path / str(i)}"], cwd=REPO,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i, (overrides, _) in enumerate(BAD)]
    procs.append(subprocess.Popen([sys.executable, "-m", "tokenpo.train", "algorithm=nope"], cwd=REPO,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    results = [proc.communicate(timeout=120) for proc in procs]
    for (overrides, key), proc, (_, stderr) in zip(BAD, procs, results):
        assert proc.returncode != 0, overrides
        assert "Traceback" not in stderr, stderr
        errors = [line for line in stderr.splitlines() if line.startswith("tokenpo: error:")]
        assert len(errors) == 1 and key in errors[0], stderr
    _, stderr = results[-1]
    assert procs[-1].returncode != 0 and "Traceback" not in stderr
    assert "'algorithm/nope'" in stderr  # Hydra's own message lists the known algorithms

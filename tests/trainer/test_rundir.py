"""A new start in a run dir that holds an earlier run: the earlier results are moved aside, never overwritten;
a start that resumes there keeps them (and the run's first .hydra/)."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from support.config import SMALL
from support.env import cli_env
from support.metrics import read_metrics
from tokenpo.trainer.harness import rundir

EARLIER = {".hydra/overrides.yaml": "- seed=7\n", "metrics.jsonl": '{"step": 0}\n', "eval_before.json": "{}",
           "eval_after.json": "{}", "eval_after.arith_transfer.json": "{}", "summary.json": "{}", "final/config.json": "{}", "wandb/latest-run": "x",
           "checkpoints/step_000002/state/x": "x", "checkpoints.previous-20250101-000000/step_000005/x": "x",
           "resolved_config.json": "{}"}
# an earlier run that saved no checkpoint it could be resumed from (its stale ones set aside, a `latest` alone)
UNRESUMABLE = {**{k: v for k, v in EARLIER.items() if not k.startswith("checkpoints/")}, "checkpoints/latest": "{}"}


def write_tree(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def tree(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): p.read_text() for p in root.rglob("*") if p.is_file()}


def test_an_earlier_run_is_moved_aside_whole_and_train_log_stays(tmp_path, caplog):
    write_tree(tmp_path, {**EARLIER, "train.log": "earlier log\n",
                          "results.previous-20240101-000000/metrics.jsonl": ""})
    with caplog.at_level(logging.WARNING, logger="tokenpo"):
        folder = rundir.set_aside_earlier_run(tmp_path)
    assert folder.parent == tmp_path and folder.name.startswith("results.previous-")
    assert tree(folder) == EARLIER
    # left: the shared log, and what earlier starts had set aside already
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["train.log", "results.previous-20240101-000000", folder.name])
    (line,) = caplog.messages
    assert line == (f"{tmp_path} held a run that this start does not resume: moved .hydra, resolved_config.json, "
                    "metrics.jsonl, eval_before.json, eval_after.json, summary.json, final, checkpoints, wandb, "
                    f"eval_after.arith_transfer.json, checkpoints.previous-20250101-000000 to {folder} (train.log keeps every start's log)")


def test_an_earlier_run_without_checkpoints_is_said_to_have_saved_none(tmp_path, caplog):
    write_tree(tmp_path, {".hydra/overrides.yaml": "- seed=7\n", "metrics.jsonl": '{"step": 1}\n'})
    with caplog.at_level(logging.WARNING, logger="tokenpo"):
        rundir.set_aside_earlier_run(tmp_path)
    (line,) = caplog.messages
    assert line.startswith(f"{tmp_path} held a run that this start does not resume (it saved no checkpoint: "
                           "trainer.save_every=0, the default, saves one only when a signal stops the run; "
                           "trainer.save_every=N saves one every N steps): moved .hydra, metrics.jsonl to ")


def test_a_dir_without_results_has_nothing_to_set_aside(tmp_path):
    (tmp_path / "train.log").write_text("")
    assert rundir.set_aside_earlier_run(tmp_path) is None
    assert [p.name for p in tmp_path.iterdir()] == ["train.log"]


@pytest.mark.parametrize("resume, files, continues", [
    ("auto", ["checkpoints/step_000002/state/x"], True),
    ("auto", ["checkpoints/latest", "metrics.jsonl"], False),
    ("none", ["checkpoints/step_000002/state/x"], False),
    ("{run}/checkpoints/step_000002", ["checkpoints/step_000002/state/x"], True),
    ("{run}", ["checkpoints/step_000002/state/x"], True),
    ("{other}", ["checkpoints/step_000002/state/x"], False),
])
def test_which_starts_continue_the_run_in_the_dir(tmp_path, resume, files, continues):
    run = tmp_path / "run"
    write_tree(run, dict.fromkeys(files, "x"))
    assert rundir.continues_here(run, resume.format(run=run, other=tmp_path / "other")) is continues


@pytest.mark.e2e
def test_a_rerun_in_the_same_dir_keeps_the_earlier_run(tmp_path):
    """The command line end to end: Hydra's .hydra/ of the earlier run survives too (Hydra writes it before
    tokenpo runs unless told not to)."""
    run_dir = tmp_path / "run"
    write_tree(run_dir, {**UNRESUMABLE, "train.log": "earlier log\n"})
    result = subprocess.run([sys.executable, "-m", "tokenpo.train", *SMALL, "trainer.max_steps=1", "seed=3",
                             f"hydra.run.dir={run_dir}"], cwd=tmp_path, env=cli_env(), capture_output=True, text=True,
                            timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    (earlier,) = run_dir.glob("results.previous-*")
    assert tree(earlier) == UNRESUMABLE
    assert "held a run that this start does not resume: moved .hydra, " in result.stdout
    # the new run: its own results and Hydra files, the log of both starts
    assert [r["step"] for r in read_metrics(run_dir)] == [0, 1]
    assert (run_dir / "final" / "config.json").is_file() and not (run_dir / "checkpoints").exists()
    overrides = yaml.safe_load((run_dir / ".hydra" / "overrides.yaml").read_text())
    # as Hydra writes them: the task's overrides, hydra.* ones apart (in hydra.yaml)
    assert overrides == [*SMALL, "trainer.max_steps=1", "seed=3"]
    assert yaml.safe_load((run_dir / ".hydra" / "config.yaml").read_text())["seed"] == 3
    assert yaml.safe_load((run_dir / ".hydra" / "hydra.yaml").read_text())["hydra"]["run"]["dir"] == str(run_dir)
    log = (run_dir / "train.log").read_text()
    assert log.startswith("earlier log\n") and "step 1/1 |" in log
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == 1

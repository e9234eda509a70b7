"""Whole tiny runs (one process) over damaged run dirs: a lost `latest`, flipped bytes in DeepSpeed's model states,
and a restart with trainer.resume=none over a run with higher-numbered checkpoints."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from support.config import SMALL
from support.metrics import by_step, deterministic, read_metrics
from support.runs import in_process_training, train_run
from tokenpo.errors import ConfigError
from tokenpo.trainer.harness import checkpoint

pytestmark = pytest.mark.slow

RUN = SMALL + ["trainer.save_every=1", "trainer.keep_last=2", "eval.max_problems=2"]


def flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def step_names(root: Path) -> list[str]:
    return sorted(p.name for p in root.glob("step_*"))


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """`run/` trained to step 3; its `latest` deleted and resumed to 4; its step-4 model states flipped and resumed
    to 5; then restarted with resume=none for 2 steps. Metrics and log lines after each stage."""
    run = tmp_path_factory.mktemp("recovery") / "run"
    stages = {}
    handler = logging.FileHandler(run.parent / "log.txt")
    logging.getLogger("tokenpo").addHandler(handler)
    try:
        with in_process_training():
            train_run(run, RUN + ["trainer.max_steps=3"])
            stages["trained"] = read_metrics(run)
            (run / "checkpoints" / "latest").unlink()
            train_run(run, RUN + ["trainer.max_steps=4"])
            stages["latest lost"] = read_metrics(run)
            flip_byte(run / "checkpoints" / "step_000004" / "state" / "mp_rank_00_model_states.pt")
            train_run(run, RUN + ["trainer.max_steps=5"])
            stages["flipped"] = read_metrics(run)
            stages["before restart"] = step_names(run / "checkpoints")
            train_run(run, RUN + ["trainer.max_steps=2", "trainer.resume=none"])
    finally:
        logging.getLogger("tokenpo").removeHandler(handler)
    return {"run": run, "stages": stages, "log": (run.parent / "log.txt").read_text()}


def test_lost_latest_resumes_the_newest_step_checkpoint(runs):
    root = runs["run"] / "checkpoints"
    assert f"trainer.resume=auto: {root / 'latest'} is missing; resuming from {root / 'step_000003'}" in runs["log"]
    # steps 0-3 kept, not restarted from scratch
    trained, resumed = by_step(runs["stages"]["trained"]), by_step(runs["stages"]["latest lost"])
    assert sorted(resumed) == [0, 1, 2, 3, 4]
    assert [deterministic(resumed[s]) for s in range(4)] == [deterministic(trained[s]) for s in range(4)]


def test_flipped_model_states_fall_back_to_the_previous_checkpoint(runs):
    root = runs["run"] / "checkpoints"
    damaged = root / "step_000004" / "state" / "mp_rank_00_model_states.pt"
    assert (f"trainer.resume=auto: skipped {damaged}: crc32 differs from the one recorded when saved (corrupted); "
            f"resuming from {root / 'step_000003'}") in runs["log"]
    before, after = by_step(runs["stages"]["latest lost"]), by_step(runs["stages"]["flipped"])
    assert sorted(after) == [0, 1, 2, 3, 4, 5]
    # step 4 again from step 3's checkpoint: the same as the first time (RNG states restored from the tensor file);
    # only the first time was it the last step, with an evaluation
    assert deterministic(after[4]) == {k: v for k, v in deterministic(before[4]).items() if not k.startswith("eval/")}
    # the damaged folder was moved aside, not deleted; a path to it fails in one line
    aside = sorted(runs["run"].glob("checkpoints.previous-*"))[0]
    assert step_names(aside) == ["step_000004"]
    with pytest.raises(ConfigError, match=f"^{aside / 'step_000004' / 'state' / 'mp_rank_00_model_states.pt'}: "
                                          "crc32 differs"):
        checkpoint.find_resume_dir(str(aside / "step_000004"), runs["run"])


def test_restart_with_resume_none_keeps_its_own_checkpoints(runs):
    root = runs["run"] / "checkpoints"
    assert runs["stages"]["before restart"] == ["step_000004", "step_000005"]
    # older code pruned by name: each new save was deleted at once and `latest` named a missing folder
    assert step_names(root) == ["step_000001", "step_000002"]
    assert json.loads((root / "latest").read_text()) == {"step": 2, "path": "step_000002"}
    assert checkpoint.find_resume_dir("auto", runs["run"]) == root / "step_000002"
    aside = sorted(runs["run"].glob("checkpoints.previous-*"))[-1]
    assert step_names(aside) == ["step_000004", "step_000005"] and (aside / "latest").is_file()
    assert "moved 2 checkpoint(s) this run does not continue (step_000004, step_000005) to " in runs["log"]

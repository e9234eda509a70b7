"""Resuming is exact on 2 processes under ZeRO-3, and a save killed midway is never resumed from.

resume_ranks.py runs A (3 steps), B (the same, saving every step, its save of step 2 killed midway, then
resumed with trainer.resume=auto) and C (resumed by path from B's step-2 checkpoint into a new run dir).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import resume_ranks
from support.metrics import by_step, deterministic, read_metrics
from support.runs import run_ranks

pytestmark = pytest.mark.multiproc


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("resume")
    run_ranks(Path(resume_ranks.__file__), [str(out)], 2, out / "logs")
    return out


def test_resumed_run_reproduces_uninterrupted_metrics(runs):
    a, b = by_step(read_metrics(runs / "A")), by_step(read_metrics(runs / "B"))
    # step 2 of B's first attempt (logged before its save died) was dropped and logged again after resuming
    assert sorted(a) == sorted(b) == [0, 1, 2, 3]
    for step in (1, 2, 3):
        assert deterministic(b[step]) == deterministic(a[step]), step
    assert a[3]["grad_norm"] > 0 and "eval/accuracy" in b[3]


def test_resume_by_path_continues_from_that_checkpoint(runs):
    a, c = by_step(read_metrics(runs / "A")), by_step(read_metrics(runs / "C"))
    # a fresh run dir resumed at step 2: only step 3 is logged there
    assert sorted(c) == [3]
    assert deterministic(c[3]) == deterministic(a[3])


def test_killed_save_left_the_previous_checkpoint_in_use(runs):
    log = (runs / "logs" / "rank0.log").read_text()
    assert f"resumed from {runs / 'B' / 'checkpoints' / 'step_000001'} at step 1" in log
    checkpoints = runs / "B" / "checkpoints"
    # the resumed run saved steps 2 and 3 over the killed attempt; keep_last=2 dropped step 1
    assert sorted(p.name for p in checkpoints.iterdir()) == ["latest", "step_000002", "step_000003"]
    assert json.loads((checkpoints / "latest").read_text()) == {"step": 3, "path": "step_000003"}
    assert not list((checkpoints / "step_000002" / "state").glob("partial_rank*"))
    meta = json.loads((checkpoints / "step_000003" / "tokenpo.json").read_text())
    assert meta == {"step": 3, "world_size": 2, "zero_stage": 3}
    # the manifest, written once both ranks finished, lists every file of the folder
    files = {str(p.relative_to(checkpoints / "step_000003")) for p in (checkpoints / "step_000003").rglob("*")
             if p.is_file()}
    manifest = json.loads((checkpoints / "step_000003" / "manifest.json").read_text())
    assert set(manifest) == files - {"manifest.json"} and {"rng_rank0.pt", "rng_rank1.pt"} <= set(manifest)
    assert sorted(p.name for p in (checkpoints / "step_000003").glob("rng_rank*.pt")) == ["rng_rank0.pt", "rng_rank1.pt"]


def test_resumed_run_continues_wandb_run_and_clock(runs):
    offline = sorted((runs / "B" / "wandb").glob("offline-run-*"))
    assert len(offline) == 2, offline
    ids = {p.name.rsplit("-", 1)[1] for p in offline}
    assert len(ids) == 1, f"the resumed half started a new W&B run: {offline}"
    b = by_step(read_metrics(runs / "B"))
    # elapsed time goes on from the checkpoint's instead of restarting at zero
    assert b[2]["time/elapsed_s"] >= b[1]["time/elapsed_s"] + b[2]["timing/step_s"]


def test_generated_token_total_continues_across_the_resume(runs):
    a, b = by_step(read_metrics(runs / "A")), by_step(read_metrics(runs / "B"))
    # the running total comes back from the checkpoint's history: no restart at zero after step 1
    assert b[0]["tokens/generated_total"] == 0.0
    assert b[3]["tokens/generated_total"] == sum(a[step]["tokens/generated"] for step in (1, 2, 3)) > 0

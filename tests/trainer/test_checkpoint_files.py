"""Checkpoint folders, the `latest` pointer, killed saves and resume lookup, with a stand-in engine (one process)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

from tokenpo.errors import ConfigError
from tokenpo.trainer import checkpoint


class FakeEngine:
    """Writes and reads `state/` like DeepSpeedEngine.save_checkpoint / load_checkpoint (tag folder + client state)."""

    def __init__(self, fail_after_partial: bool = False, stage: int = 2):
        self.fail_after_partial = fail_after_partial
        self.stage = stage

    def zero_optimization_stage(self):
        return self.stage

    def save_checkpoint(self, save_dir, tag, client_state, save_latest):
        state = Path(save_dir) / tag
        state.mkdir(parents=True)
        (state / "part0.pt").write_text("shard")
        if self.fail_after_partial:
            raise KeyboardInterrupt("killed while writing")
        (state / "client.json").write_text(json.dumps(client_state))

    def load_checkpoint(self, load_dir, tag, load_optimizer_states, load_lr_scheduler_states):
        state = Path(load_dir) / tag
        return load_dir, json.loads((state / "client.json").read_text())


def test_save_renames_into_place_and_points_latest(tmp_path):
    root = tmp_path / "checkpoints"
    path = checkpoint.save(FakeEngine(), root, 4, {"step": 4}, keep_last=2)
    assert path == root / "step_000004"
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step_000004"]
    assert json.loads((root / "latest").read_text()) == {"step": 4, "path": "step_000004"}
    assert json.loads((path / "tokenpo.json").read_text()) == {"step": 4, "world_size": 1, "zero_stage": 2}
    assert (path / "rng_rank0.pt").is_file()


def test_keep_last_deletes_the_oldest(tmp_path):
    root = tmp_path / "checkpoints"
    for step in (1, 2, 3, 10):
        checkpoint.save(FakeEngine(), root, step, {"step": step}, keep_last=2)
    assert sorted(p.name for p in root.glob("step_*")) == ["step_000003", "step_000010"]


def test_killed_save_keeps_previous_checkpoint_resumable(tmp_path):
    root = tmp_path / "checkpoints"
    checkpoint.save(FakeEngine(), root, 1, {"step": 1}, keep_last=2)
    with pytest.raises(KeyboardInterrupt):
        checkpoint.save(FakeEngine(fail_after_partial=True), root, 2, {"step": 2}, keep_last=2)
    assert (root / ".tmp-step_000002" / "state" / "part0.pt").is_file()
    assert checkpoint.find_resume_dir("auto", tmp_path) == root / "step_000001"
    assert checkpoint.load(FakeEngine(), checkpoint.find_resume_dir("auto", tmp_path)) == {"step": 1}
    # the next save clears the half-written folder
    checkpoint.save(FakeEngine(), root, 2, {"step": 2}, keep_last=2)
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step_000001", "step_000002"]


def test_find_resume_dir(tmp_path):
    root = tmp_path / "run" / "checkpoints"
    assert checkpoint.find_resume_dir("auto", tmp_path / "run") is None
    assert checkpoint.find_resume_dir("none", tmp_path / "run") is None
    checkpoint.save(FakeEngine(), root, 3, {"step": 3}, keep_last=2)
    other_run = tmp_path / "other"
    # a run dir, its checkpoints folder or one checkpoint, given by path from another run
    assert checkpoint.find_resume_dir(str(tmp_path / "run"), other_run) == root / "step_000003"
    assert checkpoint.find_resume_dir(str(root), other_run) == root / "step_000003"
    assert checkpoint.find_resume_dir(str(root / "step_000003"), other_run) == root / "step_000003"
    with pytest.raises(ConfigError, match="no checkpoint there"):
        checkpoint.find_resume_dir(str(tmp_path / "missing"), other_run)
    (root / "latest").write_text(json.dumps({"step": 9, "path": "step_000009"}))
    with pytest.raises(ConfigError, match="names step_000009, which is missing"):
        checkpoint.find_resume_dir("auto", tmp_path / "run")


def test_load_refuses_another_number_of_processes_or_zero_stage(tmp_path):
    path = checkpoint.save(FakeEngine(stage=2), tmp_path, 1, {"step": 1}, keep_last=2)
    with pytest.raises(ConfigError, match="written under ZeRO stage 2; resume it with deepspeed.stage=2, not 3"):
        checkpoint.load(FakeEngine(stage=3), path)
    (path / "tokenpo.json").write_text(json.dumps({"step": 1, "world_size": 4, "zero_stage": 2}))
    with pytest.raises(ConfigError, match="written by 4 process\\(es\\); resume it with 4, not 1"):
        checkpoint.load(FakeEngine(stage=2), path)


def test_load_restores_rng_states(tmp_path):
    random.seed(1)
    torch.manual_seed(1)
    path = checkpoint.save(FakeEngine(), tmp_path, 1, {"step": 1}, keep_last=2)
    expected = (random.random(), torch.rand(3))
    random.seed(2)
    torch.manual_seed(2)
    checkpoint.load(FakeEngine(), path)
    got = (random.random(), torch.rand(3))
    assert got[0] == expected[0] and torch.equal(got[1], expected[1])


def test_trim_metrics_drops_later_steps_and_a_cut_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    lines = [json.dumps({"step": s, "loss": 0.5}) for s in range(4)]
    path.write_text("\n".join(lines) + '\n{"step": 4, "lo')
    checkpoint.trim_metrics(path, 2)
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [0, 1, 2]
    checkpoint.trim_metrics(path, -1)
    assert path.read_text() == ""

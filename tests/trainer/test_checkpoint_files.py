"""Checkpoint folders, the `latest` pointer, killed saves and resume lookup, with a stand-in engine (one process)."""

from __future__ import annotations

import json
import random
import shutil
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch

from support.checkpoints import FakeEngine, flip_byte, policy, save, saved_run
from tokenpo.errors import ConfigError
from tokenpo.trainer.harness import checkpoint
from tokenpo.trainer.harness.state import load_policy


def test_save_renames_into_place_and_points_latest(tmp_path):
    root = tmp_path / "checkpoints"
    path = save(FakeEngine(), root, 4, {"step": 4}, keep_last=2)
    assert path == root / "step_000004"
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step_000004"]
    assert json.loads((root / "latest").read_text()) == {"step": 4, "path": "step_000004"}
    assert json.loads((path / "tokenpo.json").read_text()) == {"step": 4, "world_size": 1, "zero_stage": 2}
    assert (path / "rng_rank0.pt").is_file()
    manifest = json.loads((path / "manifest.json").read_text())
    assert sorted(manifest) == ["rng_rank0.pt", "state/client.json", "state/part0.pt", "tokenpo.json"]
    assert manifest["state/part0.pt"] == {"bytes": 5, "crc32": f"{zlib.crc32(b'shard'):08x}"}


def test_keep_last_deletes_the_oldest(tmp_path):
    root = tmp_path / "checkpoints"
    for step in (1, 2, 3, 10):
        save(FakeEngine(), root, step, {"step": step}, keep_last=2)
    assert sorted(p.name for p in root.glob("step_*")) == ["step_000003", "step_000010"]


def test_killed_save_keeps_previous_checkpoint_resumable(tmp_path):
    root = tmp_path / "checkpoints"
    save(FakeEngine(), root, 1, {"step": 1}, keep_last=2)
    with pytest.raises(KeyboardInterrupt):
        save(FakeEngine(fail_after_partial=True), root, 2, {"step": 2}, keep_last=2)
    assert (root / ".tmp-step_000002" / "state" / "part0.pt").is_file()
    assert checkpoint.find_resume_dir("auto", tmp_path) == root / "step_000001"
    assert load_policy(policy(FakeEngine()), checkpoint.find_resume_dir("auto", tmp_path)) == {"step": 1}
    # the next save clears the half-written folder
    save(FakeEngine(), root, 2, {"step": 2}, keep_last=2)
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step_000001", "step_000002"]


def test_find_resume_dir(tmp_path):
    root = tmp_path / "run" / "checkpoints"
    assert checkpoint.find_resume_dir("auto", tmp_path / "run") is None
    assert checkpoint.find_resume_dir("none", tmp_path / "run") is None
    save(FakeEngine(), root, 3, {"step": 3}, keep_last=2)
    other_run = tmp_path / "other"
    # a run dir, its checkpoints folder or one checkpoint, given by path from another run
    assert checkpoint.find_resume_dir(str(tmp_path / "run"), other_run) == root / "step_000003"
    assert checkpoint.find_resume_dir(str(root), other_run) == root / "step_000003"
    assert checkpoint.find_resume_dir(str(root / "step_000003"), other_run) == root / "step_000003"
    with pytest.raises(ConfigError, match="no checkpoint there"):
        checkpoint.find_resume_dir(str(tmp_path / "missing"), other_run)
    (root / "latest").write_text(json.dumps({"step": 9, "path": "step_000009"}))
    with pytest.raises(ConfigError, match="names step_000009, which is missing"):
        checkpoint.find_resume_dir(str(tmp_path / "run"), other_run)


def test_load_refuses_another_number_of_processes_or_zero_stage(tmp_path):
    path = save(FakeEngine(stage=2), tmp_path, 1, {"step": 1}, keep_last=2)
    with pytest.raises(ConfigError, match="written under ZeRO stage 2; resume it with deepspeed.stage=2, not 3"):
        load_policy(policy(FakeEngine(stage=3)), path)
    (path / "tokenpo.json").write_text(json.dumps({"step": 1, "world_size": 4, "zero_stage": 2}))
    with pytest.raises(ConfigError, match="written by 4 process\\(es\\); resume it with 4, not 1"):
        load_policy(policy(FakeEngine(stage=2)), path)


def test_load_restores_rng_states(tmp_path):
    random.seed(1)
    np.random.seed(1)
    torch.manual_seed(1)
    path = save(FakeEngine(), tmp_path, 1, {"step": 1}, keep_last=2)
    expected = (random.random(), np.random.rand(), torch.rand(3))
    random.seed(2)
    np.random.seed(2)
    torch.manual_seed(2)
    load_policy(policy(FakeEngine()), path)
    got = (random.random(), np.random.rand(), torch.rand(3))
    assert got[:2] == expected[:2] and torch.equal(got[2], expected[2])


def test_trim_metrics_drops_later_steps_and_a_cut_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    lines = [json.dumps({"step": s, "loss": 0.5}) for s in range(4)]
    path.write_text("\n".join(lines) + '\n{"step": 4, "lo')
    checkpoint.trim_metrics(path, 2)
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [0, 1, 2]
    checkpoint.trim_metrics(path, -1)
    assert path.read_text() == ""


def test_keep_last_never_deletes_the_checkpoint_just_written(tmp_path):
    root = saved_run(tmp_path, steps=(5, 6))
    # a new history saving step 1 next to higher-numbered ones (older code pruned by name: step_000001 went)
    save(FakeEngine(), root, 1, {"step": 1}, keep_last=2)
    assert sorted(p.name for p in root.glob("step_*")) == ["step_000001", "step_000005", "step_000006"]
    assert json.loads((root / "latest").read_text()) == {"step": 1, "path": "step_000001"}


def test_fresh_start_moves_earlier_checkpoints_aside(tmp_path, caplog):
    root = saved_run(tmp_path, steps=(2, 3))
    with caplog.at_level("WARNING"):
        checkpoint.set_aside_stale(root, None)
    assert list(root.iterdir()) == []
    [previous] = (tmp_path / "run").glob("checkpoints.previous-*")
    assert sorted(p.name for p in previous.iterdir()) == ["latest", "step_000002", "step_000003"]
    assert f"moved 2 checkpoint(s) this run does not continue (step_000002, step_000003) to {previous}" in caplog.text
    # the restarted run's saves are kept and resumed from
    for step in (1, 2):
        save(FakeEngine(), root, step, {"step": step}, keep_last=2)
    assert checkpoint.find_resume_dir("auto", tmp_path / "run") == root / "step_000002"
    assert load_policy(policy(FakeEngine()), root / "step_000002") == {"step": 2}


def test_resuming_an_earlier_checkpoint_moves_the_later_ones_aside(tmp_path):
    root = saved_run(tmp_path, steps=(1, 2, 3), keep_last=3)
    checkpoint.set_aside_stale(root, root / "step_000001")
    assert [p.name for p in root.glob("step_*")] == ["step_000001"]
    assert json.loads((root / "latest").read_text()) == {"step": 1, "path": "step_000001"}
    [previous] = (tmp_path / "run").glob("checkpoints.previous-*")
    assert sorted(p.name for p in previous.iterdir()) == ["step_000002", "step_000003"]
    # resuming the newest, or from another run's checkpoint into an empty dir, moves nothing
    checkpoint.set_aside_stale(root, root / "step_000001")
    checkpoint.set_aside_stale(tmp_path / "new" / "checkpoints", root / "step_000001")
    assert len(list((tmp_path / "run").glob("checkpoints.previous-*"))) == 1


def test_auto_resumes_the_newest_checkpoint_when_latest_is_gone(tmp_path, caplog):
    root = saved_run(tmp_path)
    (root / "latest").unlink()
    with caplog.at_level("WARNING"):
        assert checkpoint.find_resume_dir("auto", tmp_path / "run") == root / "step_000002"
    assert caplog.messages == [f"trainer.resume=auto: {root / 'latest'} is missing; "
                               f"resuming from {root / 'step_000002'}"]


DAMAGE = {
    "flipped model state": ("state/part0.pt", flip_byte, "crc32 differs from the one recorded when saved"),
    "truncated rng": ("rng_rank0.pt", lambda p: p.write_bytes(p.read_bytes()[:100]), "bytes, "),
    "empty rng": ("rng_rank0.pt", lambda p: p.write_bytes(b""), "0 bytes, "),
    "missing state": ("state/client.json", Path.unlink, "missing (listed in manifest.json)"),
    "empty manifest": ("manifest.json", lambda p: p.write_text(""), "unreadable (JSONDecodeError"),
}


@pytest.mark.parametrize("damage", DAMAGE)
def test_auto_falls_back_past_a_damaged_checkpoint_and_a_path_to_it_fails_in_one_line(tmp_path, caplog, damage):
    root = saved_run(tmp_path)
    name, spoil, problem = DAMAGE[damage]
    spoil(root / "step_000002" / name)
    with caplog.at_level("WARNING"):
        assert checkpoint.find_resume_dir("auto", tmp_path / "run") == root / "step_000001"
    [warning] = caplog.messages
    assert warning.startswith(f"trainer.resume=auto: skipped {root / 'step_000002' / name}: ") and problem in warning
    assert warning.endswith(f"; resuming from {root / 'step_000001'}")
    for explicit in (root / "step_000002", tmp_path / "run"):
        with pytest.raises(checkpoint.CheckpointError) as err:
            checkpoint.find_resume_dir(str(explicit), tmp_path / "other")
        assert str(err.value).startswith(f"{root / 'step_000002' / name}: ") and problem in str(err.value)
        assert "\n" not in str(err.value)


@pytest.mark.parametrize("content", ["", "step_000002", "[2]"])
def test_an_unreadable_latest_is_passed_over_by_auto_and_named_by_a_path(tmp_path, caplog, content):
    root = saved_run(tmp_path)
    (root / "latest").write_text(content)
    with caplog.at_level("WARNING"):
        assert checkpoint.find_resume_dir("auto", tmp_path / "run") == root / "step_000002"
    assert caplog.messages[0].startswith(f"trainer.resume=auto: {root / 'latest'}: unreadable (")
    with pytest.raises(checkpoint.CheckpointError, match=f"^{root / 'latest'}: unreadable \\([A-Za-z]+Error: .*\\)$"):
        checkpoint.find_resume_dir(str(tmp_path / "run"), tmp_path / "other")


def test_auto_refuses_when_no_checkpoint_verifies(tmp_path):
    root = saved_run(tmp_path)
    for step in (1, 2):
        flip_byte(root / f"step_00000{step}" / "state" / "part0.pt")
    with pytest.raises(checkpoint.CheckpointError, match="^trainer.resume=auto: no checkpoint in .* verifies "
                       "\\(skipped .*step_000002/state/part0.pt: crc32 .*; trainer.resume=none starts over"):
        checkpoint.find_resume_dir("auto", tmp_path / "run")


def write_legacy_rng(path: Path) -> None:
    """An RNG file as an earlier tokenpo wrote it (numpy's key as an ndarray), with the manifest recomputed."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    torch.save(state, path)
    rewrite_record(path.parent, path.name)


def rewrite_record(folder: Path, name: str, **record) -> None:
    """The manifest record of `folder / name` recomputed (or replaced by `record`): the file verifies again."""
    manifest = json.loads((folder / "manifest.json").read_text())
    data = (folder / name).read_bytes()
    manifest[name] = record or {"bytes": len(data), "crc32": f"{zlib.crc32(data):08x}"}
    (folder / "manifest.json").write_text(json.dumps(manifest))


def test_checkpoints_of_an_earlier_format_are_refused_in_one_line(tmp_path):
    root = saved_run(tmp_path)
    path = root / "step_000002"
    other = tmp_path / "other"
    earlier = {
        "no manifest": (lambda: (path / "manifest.json").unlink(), "resume",
                        f"checkpoint {path}: no manifest.json (an incomplete save, or a checkpoint of an earlier "
                        "tokenpo)"),
        "sha256 records": (lambda: rewrite_record(path, "tokenpo.json", bytes=1, sha256="00"), "resume",
                           f"{path / 'manifest.json'}: the record of tokenpo.json has bytes, sha256, not bytes and "
                           "crc32 (written by an earlier tokenpo: not resumable by this one)"),
        "no ZeRO stage": (lambda: ((path / "tokenpo.json").write_text('{"step": 2, "world_size": 1}'),
                                   rewrite_record(path, "tokenpo.json")), "load",
                          f"{path / 'tokenpo.json'}: no step, world_size and zero_stage (KeyError: 'zero_stage'; "
                          "written by an earlier tokenpo: not resumable by this one)"),
        "numpy RNG": (lambda: write_legacy_rng(path / "rng_rank0.pt"), "load",
                      f"{path / 'rng_rank0.pt'}: holds objects other than tensors and numbers (refused, not run)"),
    }
    for name, (make_earlier, when, message) in earlier.items():
        shutil.rmtree(root)
        saved_run(tmp_path)
        make_earlier()
        with pytest.raises(checkpoint.CheckpointError) as err:
            resume_dir = checkpoint.find_resume_dir(str(path), other)
            assert when == "load", name
            load_policy(policy(), resume_dir)
        assert str(err.value) == message, name
        if when == "resume":  # auto passes over it to the checkpoint before
            assert checkpoint.find_resume_dir("auto", tmp_path / "run") == root / "step_000001", name


class Payload:
    """Unpickling it creates the file `marker`: what a tampered checkpoint could run."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return open, (str(self.marker), "w")


def tamper_rng(path: Path, marker: Path, *, update_manifest: bool) -> None:
    rng_file = path / "rng_rank0.pt"
    torch.save({"python": random.getstate(), "payload": Payload(marker)}, rng_file)
    if update_manifest:
        rewrite_record(path, "rng_rank0.pt")


def test_a_tampered_rng_file_is_refused_not_run(tmp_path):
    root = saved_run(tmp_path)
    path, marker = root / "step_000002", tmp_path / "pwned"
    # tampered alone: the checksum no longer matches, auto resumes from the previous checkpoint, a path fails
    tamper_rng(path, marker, update_manifest=False)
    assert checkpoint.find_resume_dir("auto", tmp_path / "run") == root / "step_000001"
    with pytest.raises(checkpoint.CheckpointError, match="rng_rank0.pt: .* bytes, .* when saved"):
        checkpoint.find_resume_dir(str(path), tmp_path / "other")
    # with the manifest recomputed it verifies, and torch.load(weights_only=True) refuses the object
    tamper_rng(path, marker, update_manifest=True)
    with pytest.raises(checkpoint.CheckpointError) as err:
        load_policy(policy(FakeEngine()), checkpoint.find_resume_dir(str(path), tmp_path / "other"))
    assert str(err.value) == f"{path / 'rng_rank0.pt'}: holds objects other than tensors and numbers (refused, not run)"
    assert not marker.exists()


def test_quick_lookup_checks_sizes_without_hashing_or_logging(tmp_path, caplog):
    root = saved_run(tmp_path)
    flip_byte(root / "step_000002" / "state" / "part0.pt")
    (root / "step_000001" / "rng_rank0.pt").write_bytes(b"")
    with caplog.at_level("WARNING"):
        assert checkpoint.find_resume_dir("auto", tmp_path / "run", quick=True) == root / "step_000002"
        with pytest.raises(ConfigError, match="rng_rank0.pt: 0 bytes, "):
            checkpoint.find_resume_dir(str(root / "step_000001"), tmp_path / "other", quick=True)
    assert caplog.messages == []


def test_resume_check_covers_full_fine_tuning_both_ways(tmp_path):
    full = {"step": 1, "world_size": 1, "zero_stage": 2}  # a full fine-tuning checkpoint records no lora key
    (tmp_path / checkpoint.META).write_text(json.dumps(full))
    checkpoint.check_adapters(tmp_path, None)
    with pytest.raises(ConfigError, match="was trained with full fine-tuning: resume it with model.lora.rank=0"):
        checkpoint.check_adapters(tmp_path, {"rank": 2})
    (tmp_path / checkpoint.META).write_text(json.dumps(full | {"lora": {"rank": 2}}))
    with pytest.raises(ConfigError, match="was trained with LoRA rank 2: resume it with model.lora.rank=2"):
        checkpoint.check_adapters(tmp_path, None)

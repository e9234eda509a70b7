"""Each rank checksums the checkpoint files it wrote, on save and on resume (issue 27 item 3)."""

from __future__ import annotations

import json
from pathlib import Path

import checkpoint_ranks
import pytest

from support.checkpoints import flip_byte, save
from support.runs import run_ranks
from tokenpo.trainer.harness import checkpoint
from tokenpo.trainer.harness.checkpoint_manifest import owner

RANK0 = ["mp_rank_00_model_states.pt", "tokenpo.json"]


@pytest.mark.parametrize("name, world_size, rank", [
    ("state/zero_pp_rank_3_mp_rank_00_optim_states.pt", 8, 3),
    ("state/bf16_zero_pp_rank_5_mp_rank_00_optim_states.pt", 8, 5),
    ("state/zero_pp_rank_1_mp_rank_00_model_states.pt", 2, 1),  # ZeRO-3: every rank its model shard
    ("rng_rank7.pt", 8, 7),
    ("state/mp_rank_00_model_states.pt", 8, 0),  # ZeRO 0-2: rank 0 writes the whole model
    ("tokenpo.json", 8, 0),
    ("state/zero_pp_rank_1_mp_rank_00_optim_states.pt", 1, 0),  # one process looks at all of them
])
def test_the_rank_that_wrote_a_file_checksums_it(name, world_size, rank):
    assert owner(name, world_size) == rank


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("checkpoint_ranks")
    run_ranks(Path(checkpoint_ranks.__file__), [str(out)], 2, out / "logs", timeout_s=120)
    return out


@pytest.mark.multiproc
def test_each_rank_checksums_its_own_files_on_save_and_resume(two_ranks):
    ranks = [json.loads((two_ranks / f"rank{r}.json").read_text()) for r in (0, 1)]
    mine = {0: {"state/mp_rank_00_model_states.pt", "state/zero_pp_rank_0_mp_rank_00_optim_states.pt",
                "rng_rank0.pt", "tokenpo.json"},
            1: {"state/zero_pp_rank_1_mp_rank_00_optim_states.pt", "rng_rank1.pt"}}
    for r in (0, 1):
        for phase in ("save 1", "save 2", "verify intact"):
            assert sorted(ranks[r]["checksummed"][phase]) == sorted(mine[r]), (r, phase)
    manifest = json.loads((two_ranks / "run" / "checkpoints" / "step_000001" / "manifest.json").read_text())
    assert sorted(manifest) == sorted(mine[0] | mine[1])
    assert manifest["state/zero_pp_rank_1_mp_rank_00_optim_states.pt"]["bytes"] == 3000
    assert all(set(record) == {"bytes", "crc32"} for record in manifest.values())


@pytest.mark.multiproc
def test_a_damaged_shard_of_rank_1_is_caught_and_every_rank_falls_back(two_ranks):
    root = two_ranks / "run" / "checkpoints"
    for r in (0, 1):
        resumed = json.loads((two_ranks / f"rank{r}.json").read_text())["resumed"]
        assert resumed == {"intact": str(root / "step_000002"), "damaged": str(root / "step_000001")}
    shard = root / "step_000002" / "state" / "zero_pp_rank_1_mp_rank_00_optim_states.pt"
    warning = (f"trainer.resume=auto: skipped {shard}: crc32 differs from the one recorded when saved (corrupted); "
               f"resuming from {root / 'step_000001'}")
    assert warning in (two_ranks / "logs" / "rank0.log").read_text()
    assert "skipped" not in (two_ranks / "logs" / "rank1.log").read_text()


def test_verify_checkpoints_sizes_records_and_checks_sizes_only(tmp_path):
    root = tmp_path / "run" / "checkpoints"
    for step in (1, 2):
        save(None, root, step, {"step": step}, keep_last=2, with_checksums=False)
    path = root / "step_000002"
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["state/part0.pt"] == {"bytes": 5}
    # a flipped byte goes unseen in sizes mode (and in full mode, which has no checksum to compare), a cut file not
    flip_byte(path / "state" / "part0.pt")
    for with_checksums in (False, True):
        assert checkpoint.find_resume_dir("auto", tmp_path / "run", with_checksums=with_checksums) == path
    (path / "state" / "part0.pt").write_text("sh")
    with pytest.raises(checkpoint.CheckpointError, match="part0.pt: 2 bytes, 5 when saved"):
        checkpoint.find_resume_dir(str(path), tmp_path / "other", with_checksums=False)
    assert checkpoint.find_resume_dir("auto", tmp_path / "run", with_checksums=False) == root / "step_000001"
    # a checkpoint saved with checksums is checked by sizes alone in sizes mode
    save(None, root, 3, {"step": 3}, keep_last=3)
    flip_byte(root / "step_000003" / "state" / "part0.pt")
    assert checkpoint.find_resume_dir("auto", tmp_path / "run", with_checksums=False) == root / "step_000003"

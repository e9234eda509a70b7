"""A worker process of a `trainer.nproc=N` job, with training stubbed out."""

from __future__ import annotations

import json

from tokenpo.trainer.processes import worker
from tokenpo.trainer.harness.rundir import RESOLVED


def test_a_worker_removes_a_stale_build_lock_before_it_trains(tmp_path, monkeypatch, caplog):
    run_dir, extensions = tmp_path / "run", tmp_path / "extensions"
    run_dir.mkdir()
    (run_dir / RESOLVED).write_text(json.dumps({"config": {}, "name": "n", "group": "g"}))
    (extensions / "deepspeed_shm_comm").mkdir(parents=True)
    lock = extensions / "deepspeed_shm_comm" / "lock"
    lock.touch()
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(extensions))
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "0")
    seen = []
    monkeypatch.setattr(worker, "die_with_launcher", lambda: None)
    monkeypatch.setattr("tokenpo.config.build_config", lambda config: config)  # the worker's command builds it
    monkeypatch.setattr(worker, "train", lambda *args: seen.append(lock.exists()))
    with caplog.at_level("WARNING"):
        assert worker.main([str(run_dir)]) == 0
    assert seen == [False]
    assert any(m.startswith(f"removed {lock}: the JIT build lock of deepspeed_shm_comm") for m in caplog.messages)

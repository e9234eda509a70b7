"""After a crash and a resume, W&B holds every step of metrics.jsonl: the resumed logger logs again what the killed
process lost (offline: read back from the run's own files; online: from where the server says the run stands)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import wandb
from wandb.proto import wandb_internal_pb2

from tokenpo.logger.config import LoggerConfig
from tokenpo.logger.run_logger import RunLogger
from tokenpo.trainer.harness.identity import RunIdentity
from tokenpo.logger.wandb_files import history_steps, offline_steps, records

# a training process that logs steps 0-3 and is then killed
KILLED_RUN = """
import os, signal, sys
from pathlib import Path
from tokenpo.logger.config import LoggerConfig
from tokenpo.logger.run_logger import RunLogger
from tokenpo.trainer.harness.identity import RunIdentity
run_dir = Path(sys.argv[1])
logger = RunLogger(LoggerConfig(mode="offline"), RunIdentity(run_dir, "r", "g", {}), enabled=True)
(run_dir / "wandb_id").write_text(logger.wandb_id)
for step in range(4):
    logger.log(step, {"reward/mean": step / 10})
os.kill(os.getpid(), signal.SIGKILL)
"""


def offline_logger(run_dir: Path, resume_id: str | None = None) -> RunLogger:
    return RunLogger(LoggerConfig(mode="offline"), RunIdentity(run_dir, "r", "g", {}), enabled=True,
                     resume_id=resume_id)


def finish(logger: RunLogger) -> None:
    """Finish the run and stop W&B's service process, which writes the run's file until it stops."""
    logger.finish()
    wandb.teardown()


def history(path: Path) -> dict[int, dict]:
    """{step: {key: value}} of the history rows in a .wandb file."""
    rows = {}
    for raw in records(path):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(raw)
        if record.WhichOneof("record_type") == "history":
            items = {(item.key or item.nested_key[0]): json.loads(item.value_json) for item in record.history.item}
            rows[record.history.step.num] = {k: v for k, v in items.items() if not k.startswith("_")}
    return rows


@pytest.mark.e2e
def test_steps_a_killed_process_lost_are_logged_again_on_resume(tmp_path):
    killed = subprocess.run([sys.executable, "-c", KILLED_RUN, str(tmp_path)], timeout=120,
                            env=dict(os.environ, WANDB_SILENT="true"))
    assert killed.returncode == -signal.SIGKILL
    run_id = (tmp_path / "wandb_id").read_text()
    (first,) = tmp_path.glob("wandb/offline-run-*/run-*.wandb")
    # W&B writes asynchronously: the kill loses the steps it had not written (all four, in practice)
    lost = {0, 1, 2, 3} - history_steps(first)
    # W&B names an offline run's folder by the second it started: a resume within the same second as the killed
    # start would reuse its folder (a real restart takes longer than that; this test can be that fast)
    time.sleep(1.0 - time.time() % 1.0 + 0.05)

    logger = offline_logger(tmp_path, resume_id=run_id)
    logger.log(4, {"reward/mean": 0.4})
    finish(logger)
    (second,) = set(tmp_path.glob(f"wandb/offline-run-*-{run_id}/run-{run_id}.wandb")) - {first}
    # exactly the lost steps again, with their values, then the new one
    assert history(second) == {step: {"reward/mean": step / 10} for step in sorted(lost | {4})}
    metric_steps = [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert offline_steps(tmp_path / "wandb", run_id) == set(metric_steps) == {0, 1, 2, 3, 4}


class FakeRun:
    """An online W&B run that the server resumed at step 2: it records the logger's calls."""

    id = "run1"
    starting_step = 2

    def __init__(self) -> None:
        self.logged = []

    def log(self, metrics: dict, step: int) -> None:
        self.logged.append((step, metrics))


def test_an_online_run_gets_the_steps_after_the_servers(tmp_path, monkeypatch):
    run = FakeRun()
    monkeypatch.setattr(wandb, "init", lambda **kwargs: run)
    rows = [{"step": 0, "eval/accuracy": 0.5}, {"step": 1, "loss": 1.0}, {"step": 2, "loss": None, "reward/mean": 0.2},
            {"step": 3, "loss": 3.0}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows) + '{"step": 4, "lo')
    RunLogger(LoggerConfig(mode="online"), RunIdentity(tmp_path, "r", "g", {}), enabled=True, resume_id="run1")
    # a non-finite value (stored as null) is left out; the line cut short by the kill too
    assert run.logged == [(2, {"reward/mean": 0.2}), (3, {"loss": 3.0})]


def test_records_spanning_blocks_are_read_back(tmp_path):
    logger = offline_logger(tmp_path)
    # about 2 KB a row: the file spans several 32 KiB blocks and rows cross block boundaries
    for step in range(60):
        logger.log(step, {f"metric/{i:03d}": step + i / 1000 for i in range(100)})
    finish(logger)
    (path,) = tmp_path.glob("wandb/offline-run-*/run-*.wandb")
    assert path.stat().st_size > 3 * 32 * 1024
    rows = history(path)
    assert sorted(rows) == list(range(60))
    assert rows[59]["metric/099"] == 59.099

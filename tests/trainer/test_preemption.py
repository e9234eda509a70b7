"""Preemption: SIGUSR1 / SIGUSR2 (Slurm's --signal, submitit) save a checkpoint after the step, the job is requeued
(submitit's own handler, or `scontrol requeue` in a bare Slurm job) and the requeued run resumes exactly.

Slurm is a stand-in here: a recording `scontrol` on PATH and submitit's real SignalHandler with a recording job
environment. No Slurm cluster has run this."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from hydra.types import RunMode
from omegaconf import OmegaConf

# the cluster extra (scripts/setup.sh); the vLLM environment, which runs only `-m vllm` tests, has none
pytest.importorskip("submitit")
from submitit.core.job_environment import SignalHandler  # noqa: E402
from submitit.core.utils import DelayedSubmission, JobPaths  # noqa: E402

from support.config import SMALL
from support.env import cli_env
from support.metrics import by_step, deterministic, read_metrics
from support.runs import in_process_training, train_run, wait_for_step
import tokenpo.train
from tokenpo.trainer.processes import launch
from tokenpo.trainer.core import step as trainer_step

PY = sys.executable
RUN = SMALL + ["trainer.max_steps=4"]


@pytest.fixture
def own_signal_handlers():
    """The stop signals' handlers of this process, put back after the test."""
    saved = {sig: signal.getsignal(sig) for sig in launch.STOP_SIGNALS}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


class Resubmittable:
    """A submitted callable with a `checkpoint` as hydra-submitit-launcher's launcher has: it resubmits itself."""

    def __call__(self) -> None:
        pass

    def checkpoint(self) -> DelayedSubmission:
        return DelayedSubmission(self)


class RecordingJobEnvironment:
    """submitit's job environment as a task of rank `global_rank` sees it; `_requeue` records instead of calling
    `scontrol requeue`."""

    def __init__(self, global_rank: int) -> None:
        self.global_rank = global_rank
        self.requeued: list[int] = []

    def _requeue(self, countdown: int) -> None:
        self.requeued.append(countdown)


def install_submitit_handler(tmp_path: Path, global_rank: int = 0) -> RecordingJobEnvironment:
    """SIGUSR2 -> submitit's checkpoint_and_try_requeue, as submitit's process_job installs it in a job."""
    env = RecordingJobEnvironment(global_rank)
    delayed = DelayedSubmission(Resubmittable())
    delayed.set_timeout(60, 3)
    handler = SignalHandler(env, JobPaths(tmp_path, job_id="77"), delayed)
    signal.signal(signal.SIGUSR2, handler.checkpoint_and_try_requeue)
    return env


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A: 4 uninterrupted steps. B: the same run with submitit's SIGUSR2 handler installed, sent a real SIGUSR2 during
    step 1 (stopped there, then handed over), then resumed with trainer.resume=auto to step 4."""
    out = tmp_path_factory.mktemp("preempted")
    saved = {sig: signal.getsignal(sig) for sig in launch.STOP_SIGNALS}
    update = trainer_step.update_policy
    calls = []

    def update_signalled_at_step_1(*args):
        calls.append(1)
        if len(calls) == 1:
            os.kill(os.getpid(), signal.SIGUSR2)
        return update(*args)

    try:
        with in_process_training():
            train_run(out / "A", RUN)
            env = install_submitit_handler(out)
            submitit_handler = signal.getsignal(signal.SIGUSR2)
            trainer_step.update_policy = update_signalled_at_step_1
            try:
                stopped = train_run(out / "B", RUN)
            finally:
                trainer_step.update_policy = update
            restored = signal.getsignal(signal.SIGUSR2) == submitit_handler
            with pytest.raises(launch.Requeued) as requeued:
                launch.hand_over_stop(stopped["signal"], rank0=True)
            checkpoint = json.loads((out / "B" / "checkpoints" / "latest").read_text())
            train_run(out / "B", RUN)
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
    return SimpleNamespace(out=out, stopped=stopped, env=env, restored=restored, exit_code=requeued.value.code,
                           checkpoint=checkpoint)


@pytest.mark.e2e
def test_sigusr2_saves_after_the_step_and_submitit_requeues(runs):
    assert runs.stopped["interrupted"] and runs.stopped["steps"] == 1 and runs.stopped["signal"] == signal.SIGUSR2
    assert runs.checkpoint["step"] == 1
    # the run put submitit's handler back; it requeued the job (3 time-outs left) and exits -1, its way
    assert runs.restored and runs.env.requeued == [3] and runs.exit_code == -1
    assert (runs.out / "77_submitted.pkl").is_file()  # the resubmitted callable, for the requeued job


def test_the_requeued_run_resumes_to_the_uninterrupted_metrics(runs):
    a, b = by_step(read_metrics(runs.out / "A")), by_step(read_metrics(runs.out / "B"))
    assert sorted(a) == sorted(b) == [0, 1, 2, 3, 4]
    for step in (1, 2, 3, 4):
        assert deterministic(b[step]) == deterministic(a[step]), step
    assert a[4]["grad_norm"] > 0


def test_submitit_on_another_rank_neither_requeues_nor_exits(tmp_path, own_signal_handlers):
    env = install_submitit_handler(tmp_path, global_rank=1)
    launch.hand_over_stop(signal.SIGUSR2, rank0=False)
    assert env.requeued == []


def test_a_requeued_job_is_not_a_failed_job_of_its_sweep(monkeypatch):
    def requeued(tree, in_sweep):
        raise launch.Requeued(-1)

    monkeypatch.setattr(tokenpo.train, "run_job", requeued)
    monkeypatch.setattr(tokenpo.train.HydraConfig, "get",
                        staticmethod(lambda: SimpleNamespace(mode=RunMode.MULTIRUN, job=SimpleNamespace(num=3))))
    with pytest.raises(launch.Requeued):  # a JobFailed would be recorded as the sweep's failed job
        tokenpo.train.hydra_main(OmegaConf.create({}))


@pytest.fixture
def scontrol(tmp_path, monkeypatch):
    """A recording `scontrol` first on PATH: its arguments, one call per line."""
    calls = tmp_path / "scontrol.calls"
    fake = tmp_path / "bin" / "scontrol"
    fake.parent.mkdir()
    fake.write_text(f'#!/bin/sh\necho "$@" >> {calls}\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    for var in ("SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID"):
        monkeypatch.delenv(var, raising=False)
    return lambda: calls.read_text().splitlines() if calls.is_file() else []


def test_a_bare_slurm_job_is_requeued_by_rank_0_after_sigusr1(scontrol, monkeypatch, own_signal_handlers):
    signal.signal(signal.SIGUSR1, signal.SIG_DFL)
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    launch.hand_over_stop(signal.SIGUSR1, rank0=False)
    launch.hand_over_stop(signal.SIGTERM, rank0=True)  # a plain stop: no requeue
    assert scontrol() == []
    launch.hand_over_stop(signal.SIGUSR1, rank0=True)
    assert scontrol() == ["requeue 4242"]
    # a job of an array is named <array job>_<task>, as Lightning names it
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "4200")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "7")
    launch.hand_over_stop(signal.SIGUSR2, rank0=True)
    assert scontrol() == ["requeue 4242", "requeue 4200_7"]


def test_outside_slurm_a_requeue_signal_only_stops(scontrol, own_signal_handlers):
    signal.signal(signal.SIGUSR1, signal.SIG_DFL)
    launch.hand_over_stop(signal.SIGUSR1, rank0=True)
    assert scontrol() == []


# a worker that exits 0 on SIGUSR1 (as a run does after its checkpoint), once it has said it is ready
USR1_WORKER = ("import pathlib, signal, sys, time; signal.signal(signal.SIGUSR1, lambda s, f: sys.exit(0)); "
               "pathlib.Path(sys.argv[1]).touch(); time.sleep(20)")


def test_sigusr1_to_a_local_job_is_forwarded_to_every_worker(tmp_path, own_signal_handlers):
    # a stand-in for the job's own handling, so that a supervisor that does not forward leaves this process alive
    signal.signal(signal.SIGUSR1, lambda signum, frame: None)
    ready = [tmp_path / f"{rank}.ready" for rank in range(2)]
    workers = [subprocess.Popen([PY, "-c", USR1_WORKER, str(path)]) for path in ready]
    deadline = time.monotonic() + 30
    while not all(path.exists() for path in ready):
        assert time.monotonic() < deadline, "workers did not start"
        time.sleep(0.05)
    before, supervised = signal.getsignal(signal.SIGUSR1), threading.Event()

    def signal_job_once_supervised():
        while signal.getsignal(signal.SIGUSR1) == before and not supervised.is_set():
            time.sleep(0.01)
        if not supervised.is_set():
            os.kill(os.getpid(), signal.SIGUSR1)

    threading.Thread(target=signal_job_once_supervised, daemon=True).start()
    start = time.monotonic()
    try:
        result = launch.supervise(workers, grace_s=5)
    finally:
        supervised.set()
    assert result == (0, signal.SIGUSR1)
    assert [w.returncode for w in workers] == [0, 0] and time.monotonic() - start < 15


@pytest.mark.slow
def test_sigusr1_to_a_slurm_run_saves_requeues_and_the_same_command_resumes(tmp_path):
    """The whole path from the command line: `sbatch --signal=USR1@120 --requeue` with the run dir named in the
    script, its requeue a recording scontrol."""
    calls = tmp_path / "scontrol.calls"
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "scontrol").write_text(f'#!/bin/sh\necho "$@" >> {calls}\n')
    (tmp_path / "bin" / "scontrol").chmod(0o755)
    env = cli_env(SLURM_JOB_ID="4242", PATH=f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    steps = ["trainer.max_steps=12"]
    cmd = [PY, "-m", "tokenpo.train", *SMALL, *steps, f"hydra.run.dir={tmp_path / 'run'}"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for_step(tmp_path / "run" / "metrics.jsonl", 1, proc)
    proc.send_signal(signal.SIGUSR1)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    stopped = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert stopped["interrupted"] and stopped["signal"] == signal.SIGUSR1 and stopped["steps"] < 12
    assert json.loads((tmp_path / "run" / "checkpoints" / "latest").read_text())["step"] == stopped["steps"]
    assert calls.read_text().splitlines() == ["requeue 4242"]
    # the requeued job: the same command
    resumed = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    reference = subprocess.run([PY, "-m", "tokenpo.train", *SMALL, *steps, f"hydra.run.dir={tmp_path / 'reference'}"],
                               cwd=tmp_path, env=cli_env(), capture_output=True, text=True, timeout=300)
    assert reference.returncode == 0, reference.stderr[-3000:]
    a, b = by_step(read_metrics(tmp_path / "reference")), by_step(read_metrics(tmp_path / "run"))
    assert sorted(a) == sorted(b) == list(range(13))
    for step in range(1, 13):
        assert deterministic(b[step]) == deterministic(a[step]), step

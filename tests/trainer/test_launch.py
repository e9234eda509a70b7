"""Launching: the worker supervisor, external launchers' command lines, start-up batch checks, and whole
2-process runs from the command line (trainer.nproc=2 with a SIGTERM and a resume; torchrun)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
import torch
from transformers import AutoModelForCausalLM

from support.config import SMALL
from support.env import cli_env
from support.metrics import by_step, read_metrics
from support.runs import wait_for_step
from tokenpo.trainer.processes import launch

PY = sys.executable


def sleeper(tmp_path: Path, name: str, *, on_sigterm: str) -> subprocess.Popen:
    """A worker that signals readiness through a file, then sleeps; SIGTERM: 'exit' (status 0), 'ignore' or 'die'."""
    ready = tmp_path / f"{name}.ready"
    handler = {"exit": "lambda s, f: sys.exit(0)", "ignore": "signal.SIG_IGN", "die": "signal.SIG_DFL"}[on_sigterm]
    code = (f"import pathlib, signal, sys, time; signal.signal(signal.SIGTERM, {handler}); "
            f"pathlib.Path({str(ready)!r}).touch(); time.sleep(60)")
    proc = subprocess.Popen([PY, "-c", code])
    deadline = time.monotonic() + 30
    while not ready.exists():
        assert time.monotonic() < deadline and proc.poll() is None, "worker did not start"
        time.sleep(0.05)
    return proc


def failing(code: int) -> subprocess.Popen:
    return subprocess.Popen([PY, "-c", f"import sys, time; time.sleep(0.3); sys.exit({code})"])


def test_a_failing_worker_stops_the_others_and_sets_the_status(tmp_path):
    survivor = sleeper(tmp_path, "a", on_sigterm="die")
    start = time.monotonic()
    status, forwarded = launch.supervise([survivor, failing(3)], grace_s=5)
    assert (status, forwarded) == (3, None)
    assert survivor.returncode == -signal.SIGTERM
    assert time.monotonic() - start < 5


def test_a_worker_ignoring_sigterm_is_killed_after_the_grace_period(tmp_path):
    stubborn = sleeper(tmp_path, "a", on_sigterm="ignore")
    start = time.monotonic()
    status, _ = launch.supervise([stubborn, failing(4)], grace_s=1)
    assert status == 4 and stubborn.returncode == -signal.SIGKILL
    assert 1 <= time.monotonic() - start < 10


def test_sigterm_to_the_job_is_forwarded_to_every_worker(tmp_path):
    workers = [sleeper(tmp_path, str(i), on_sigterm="exit") for i in range(2)]
    own_handler = signal.getsignal(signal.SIGTERM)

    def terminate_job_once_supervised():
        while signal.getsignal(signal.SIGTERM) == own_handler:
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=terminate_job_once_supervised, daemon=True).start()
    status, forwarded = launch.supervise(workers, grace_s=5)
    assert (status, forwarded) == (0, signal.SIGTERM)
    assert [w.returncode for w in workers] == [0, 0]
    assert signal.getsignal(signal.SIGTERM) == own_handler


# a worker that calls die_with_launcher, then creates the file named by its first argument (if any) and sleeps
DYING_WORKER = ("from tokenpo.trainer.processes.launch import die_with_launcher; import pathlib, sys, time; die_with_launcher(); "
                "[pathlib.Path(name).touch() for name in sys.argv[1:]]; time.sleep(60)")


def gone(pid: int) -> bool:
    """Exited (a zombie counts: its new parent may be slow to reap it, or never reap it in a container)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def wait_until_gone(pids: list[int], timeout: float) -> list[int]:
    """The pids still running after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while any(not gone(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [pid for pid in pids if not gone(pid)]


def test_a_worker_dies_when_its_job_is_killed(tmp_path):
    ready = tmp_path / "ready"
    # the "job" starts a worker with the launcher's environment, reports its pid, then waits
    job_code = ("import subprocess, sys, time; from tokenpo.trainer.processes.launch import worker_env; "
                f"w = subprocess.Popen([sys.executable, '-c', {DYING_WORKER!r}, {str(ready)!r}], "
                "env=worker_env(0, 1, 0)); "
                "print(w.pid, flush=True); time.sleep(60)")
    job = subprocess.Popen([PY, "-c", job_code], stdout=subprocess.PIPE, text=True)
    worker = int(job.stdout.readline())
    deadline = time.monotonic() + 60
    while not ready.exists():
        assert time.monotonic() < deadline and not gone(worker), "worker did not start"
        time.sleep(0.05)
    job.kill()
    job.wait()
    assert wait_until_gone([worker], timeout=5) == []


def test_a_worker_whose_job_died_before_it_started_kills_itself():
    # the parent is this test process, not the "launcher" the environment names: it died already
    env = dict(os.environ, **{launch.LAUNCHER_PID: str(os.getpid() + 1_000_000)})
    worker = subprocess.run([PY, "-c", DYING_WORKER], env=env, timeout=60)
    assert worker.returncode == -signal.SIGKILL


def test_exit_status_of_a_signalled_worker():
    assert launch.exit_status(-signal.SIGKILL) == 137
    assert launch.exit_status(3) == 3


def test_external_launcher_argv(monkeypatch, tmp_path):
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    # the deepspeed launcher's --local_rank is dropped (Hydra would reject it); rank 0 keeps Hydra's run dir
    assert launch.external_launcher_argv(["a=1", "--local_rank=0", "b=2"]) == ["a=1", "b=2"]
    assert launch.external_launcher_argv(["--local_rank", "0", "hydra.run.dir=x"]) == ["hydra.run.dir=x"]
    monkeypatch.setenv("RANK", "1")
    argv = launch.external_launcher_argv(["hydra.run.dir=x", "--local_rank=1"])
    private = argv[-1].split("=", 1)[1]
    private = private.strip("'")
    assert argv == ["hydra.run.dir=x", f"hydra.run.dir='{private}'", f"hydra.sweep.dir='{private}'"]
    assert Path(private).parent == tmp_path and Path(private).is_dir()


def run_cli(args: list[str], cwd: Path, *, env: dict | None = None, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=cwd, env=env or cli_env(), capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("extra, env, message", [
    (["trainer.nproc=2", "data.prompts_per_step=3"], {},
     "data.prompts_per_step=3 does not divide across 2 process(es) x trainer.mini_batches=1; use a multiple of 2"),
    (["trainer.mini_batches=3", "data.prompts_per_step=4"], {"WORLD_SIZE": "2", "RANK": "0"},
     "data.prompts_per_step=4 does not divide across 2 process(es) x trainer.mini_batches=3; use a multiple of 6"),
    (["trainer.nproc=2"], {"WORLD_SIZE": "2", "RANK": "0"},
     "trainer.nproc=2 starts local workers itself; under an external launcher (WORLD_SIZE=2) leave trainer.nproc at 1"),
])
@pytest.mark.e2e
def test_batch_and_process_count_are_checked_before_any_work(tmp_path, extra, env, message):
    result = run_cli([PY, "-m", "tokenpo.train", *SMALL, *extra, f"hydra.run.dir={tmp_path / 'run'}"], tmp_path,
                     env=cli_env(**env), timeout=60)
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("tokenpo: error:")]
    assert errors == [f"tokenpo: error: {message}"]
    assert not (tmp_path / "run" / "resolved_config.json").exists()


def assert_exported_policy(final: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(final)
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert (final / "tokenizer.json").is_file()


@pytest.mark.multiproc
def test_nproc_two_zero3_stops_on_sigterm_then_resumes(tmp_path):
    cmd = [PY, "-m", "tokenpo.train", *SMALL, "deepspeed=zero3", "trainer.nproc=2"]
    proc = subprocess.Popen([*cmd, "trainer.max_steps=30"], cwd=tmp_path, env=cli_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    runs = tmp_path / "outputs" / "runs"
    deadline = time.monotonic() + 60
    while not (runs.is_dir() and any(runs.iterdir())):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
        time.sleep(0.1)
    (run_dir,) = runs.iterdir()
    wait_for_step(run_dir / "metrics.jsonl", 1, proc)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    assert "stopped by a signal after step" in out
    summary = json.loads((run_dir / "summary.json").read_text())
    stopped = summary["steps"]
    assert summary["interrupted"] and 1 <= stopped < 30
    assert json.loads((run_dir / "checkpoints" / "latest").read_text())["step"] == stopped
    assert max(by_step(read_metrics(run_dir))) == stopped
    assert not (run_dir / "final").exists()

    result = run_cli([*cmd, f"trainer.max_steps={stopped + 1}", f"hydra.run.dir='{run_dir}'"], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    # one run dir; every step logged once, by rank 0 only (console and metrics.jsonl)
    assert list(runs.iterdir()) == [run_dir]
    assert sorted(by_step(read_metrics(run_dir))) == list(range(stopped + 2))
    console = result.stdout + result.stderr
    assert console.count(f"step {stopped + 1}/{stopped + 1} |") == 1
    assert f"resumed from {run_dir / 'checkpoints' / f'step_{stopped:06d}'} at step {stopped}" in console
    assert f"step {stopped + 1}/{stopped + 1} |" in (run_dir / "train.log").read_text()
    assert_exported_policy(run_dir / "final")


@pytest.mark.multiproc
def test_killing_the_job_kills_its_workers(tmp_path):
    run_dir = tmp_path / "run"
    job = subprocess.Popen([PY, "-m", "tokenpo.train", *SMALL, "trainer.nproc=2", "trainer.max_steps=4",
                            f"hydra.run.dir={run_dir}"], cwd=tmp_path, env=cli_env(), stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, text=True)
    # the workers evaluated the untrained policy: they are past start-up
    wait_for_step(run_dir / "metrics.jsonl", 0, job)
    workers = [child.pid for child in psutil.Process(job.pid).children()]
    assert len(workers) == 2
    # and what they started (reward workers)
    descendants = [child.pid for child in psutil.Process(job.pid).children(recursive=True)]
    job.kill()
    job.wait()
    assert wait_until_gone(workers, timeout=5) == []
    assert wait_until_gone(descendants, timeout=5) == []
    assert not (run_dir / "final").exists()


@pytest.mark.multiproc
def test_torchrun_two_ranks_share_one_run_dir(tmp_path):
    private_tmp = tmp_path / "tmp"
    private_tmp.mkdir()
    result = run_cli([PY, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m", "tokenpo.train",
                      *SMALL, "deepspeed=zero2", "trainer.max_steps=2"], tmp_path, env=cli_env(TMPDIR=str(private_tmp)))
    assert result.returncode == 0, result.stderr[-3000:]
    (run_dir,) = (tmp_path / "outputs" / "runs").iterdir()
    assert sorted(by_step(read_metrics(run_dir))) == [0, 1, 2]
    assert (result.stdout + result.stderr).count("step 2/2 |") == 1
    # rank 1's private Hydra folder is gone
    assert not list(private_tmp.glob("tokenpo-rank-*"))
    assert_exported_policy(run_dir / "final")

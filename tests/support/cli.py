"""Command-line runs of tokenpo in subprocesses: stopped at start-up (GUARDED_TRAIN), or in a terminal."""

from __future__ import annotations

import fcntl
import os
import pty
import select
import struct
import subprocess
import sys
import termios
from pathlib import Path

from support.env import REPO, TESTS

# `python -m tokenpo.train` with the two ways into heavy work (loading the model here, starting workers) replaced
# by a loud exit: a start-up error must come before either, and before torch, transformers and DeepSpeed are imported
# (every check that needs no model runs first); at exit the script names those of them that were imported
HEAVY_MODULES = ("torch", "transformers", "deepspeed")
GUARDED_TRAIN = f"""
import atexit
import sys
import tokenpo.train
import tokenpo.trainer.processes.launch

atexit.register(lambda: print("HEAVY MODULES IMPORTED:", *[m for m in {HEAVY_MODULES!r} if m in sys.modules]))

def heavy_work(*args, **kwargs):
    sys.exit("HEAVY WORK STARTED")

tokenpo.train.run_here = tokenpo.trainer.processes.launch.launch_local_workers = heavy_work
tokenpo.train.main()
"""


def guarded_train(tmp_path: Path, *overrides: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """GUARDED_TRAIN's run; fails unless it reports which heavy modules it imported before it stopped."""
    env = dict(os.environ, **(env or {}),
               PYTHONPATH=os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, "-c", GUARDED_TRAIN, *overrides, "logger.mode=disabled",
                           f"hydra.run.dir={tmp_path / 'run'}", f"hydra.sweep.dir={tmp_path / 'sweep'}"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert proc.stdout.rstrip().splitlines()[-1].startswith("HEAVY MODULES IMPORTED:"), proc.stdout + proc.stderr
    return proc


def heavy_imports(proc: subprocess.CompletedProcess) -> list[str]:
    return proc.stdout.rstrip().splitlines()[-1].split(":", 1)[1].split()


def start_error(tmp_path: Path, *overrides: str, env: dict | None = None) -> str:
    """The one error line of a run that must stop at start-up; fails on a traceback, more than one error line, a
    zero exit status, any heavy work started or torch, transformers or DeepSpeed imported."""
    proc = guarded_train(tmp_path, *overrides, env=env)
    assert heavy_imports(proc) == [], proc.stdout
    assert proc.returncode != 0 and "Traceback" not in proc.stderr and "HEAVY WORK" not in proc.stderr, proc.stderr
    errors = [line for line in (proc.stdout + proc.stderr).splitlines() if line.startswith("tokenpo: error:")]
    assert len(errors) == 1, proc.stdout + proc.stderr
    return errors[0]


def start_up_errors(tmp_path, *overrides: str) -> list[str]:
    """The error lines of a run stopped at start-up (the tokenizer is loaded by then: transformers is imported)."""
    proc = guarded_train(tmp_path, *overrides)
    assert "Traceback" not in proc.stderr and "HEAVY WORK" not in proc.stderr, proc.stderr
    return [line for line in (proc.stdout + proc.stderr).splitlines() if line.startswith("tokenpo: error:")]


def run_in_pty(argv: list[str], env: dict, silence_s: float = 120) -> str:
    """Everything the command writes to a terminal (stdout and stderr are the pty); killed after `silence_s` without
    output."""
    leader, follower = pty.openpty()
    # a terminal 120 columns wide (a fresh pty is 0 x 0, in which a bar has no room)
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    proc = subprocess.Popen(argv, stdin=follower, stdout=follower, stderr=follower, env=env, close_fds=True)
    os.close(follower)
    chunks = []
    while True:
        ready, _, _ = select.select([leader], [], [], silence_s)
        if not ready:
            proc.kill()
            break
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the follower side closed: the command exited
            break
        if not chunk:
            break
        chunks.append(chunk)
    proc.wait(timeout=60)
    os.close(leader)
    assert proc.returncode == 0, b"".join(chunks).decode(errors="replace")[-3000:]
    return b"".join(chunks).decode(errors="replace")


def env_without_progress_settings(env: dict | None = None) -> dict:
    """`env` (default: this process's) without the switches that turn bars off."""
    env = os.environ if env is None else env
    return {k: v for k, v in env.items() if k not in ("TQDM_DISABLE", "HF_HUB_DISABLE_PROGRESS_BARS")}

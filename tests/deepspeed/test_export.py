"""The ZeRO-3 export consolidates the same state as DeepSpeed's own call, and it and DeepSpeed's checkpoint write show
progress on a terminal and nothing in a pipe (issue 23 item 2)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from support.cli import env_without_progress_settings, run_in_pty
from support.env import cli_env

# both tests run a ZeRO-3 save end to end in a subprocess
pytestmark = pytest.mark.e2e

SCRIPT = Path(__file__).with_name("zero3_save.py")
# the first DeepSpeed start of a fresh environment JIT-builds its CPU comm op with no output (~47 s idle, minutes
# under load); a process killed mid-build leaves torch's build lock behind, on which every later start waits forever
SILENCE_S = 900


def env() -> dict:
    return env_without_progress_settings(cli_env())


def frames(out: str, desc: str) -> list[str]:
    return [frame for frame in out.replace("\r", "\n").splitlines() if frame.startswith(desc)]


def test_a_terminal_sees_the_zero3_gather_and_the_checkpoint_write(tmp_path):
    out = run_in_pty([sys.executable, str(SCRIPT), str(tmp_path)], env(), SILENCE_S)
    assert "ZERO3 WORK DONE" in out, out[-3000:]
    gather = frames(out, "gathering ZeRO-3 weights")
    assert gather and "100%" in gather[-1] and "B/s" in gather[-1], gather
    # the first save has nothing to size it by (bytes and rate), the second one the first one's size
    first, second = frames(out, "saving checkpoint step 1"), frames(out, "saving checkpoint step 2")
    assert first and "B/s" in first[-1] and "%" not in first[-1], first
    assert second and "100%" in second[-1], second


def test_a_pipe_gets_the_same_state_and_files_and_no_bar(tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path)], capture_output=True, text=True, env=env(),
                          timeout=SILENCE_S)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "full: " in done.stdout and "lora: " in done.stdout and "ZERO3 WORK DONE" in done.stdout
    for text in (done.stdout, done.stderr):
        assert "gathering ZeRO-3" not in text and "saving checkpoint" not in text and "%|" not in text
    assert (tmp_path / "full" / "config.json").is_file() and (tmp_path / "lora" / "adapter").is_dir()
    assert sorted(p.name for p in (tmp_path / "checkpoints").glob("step_*")) == ["step_000001", "step_000002"]

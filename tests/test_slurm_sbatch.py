"""scripts/slurm/dapo_7b.sbatch, run as Slurm's batch step would run it, with a recording `srun` on PATH: one task per
GPU starting tokenpo.train with trainer.nproc=1 (the tasks are the ranks), a run dir named by the job id (the same
after a requeue), the extra overrides passed through, SIGUSR1 before the limit and a requeue allowed; the recorded
command composes into a memory plan."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "slurm" / "dapo_7b.sbatch"
EXPERIMENT = "paper/dapo_qwen2_5_math_7b"


def directives() -> dict[str, str]:
    found = re.findall(r"^#SBATCH --([\w-]+)(?:=(\S+))?", SCRIPT.read_text(), re.M)
    return {key: value for key, value in found}


def recorded_srun(tmp_path: Path, *overrides: str) -> list[str]:
    """The argv the script hands srun, under a job's environment."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text('#!/bin/sh\nprintf "%s\\n" "$@" > "$SRUN_ARGV"\n')
    (bin_dir / "srun").chmod(0o755)
    argv_file = tmp_path / "argv"
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", SRUN_ARGV=str(argv_file), SLURM_JOB_ID="4242",
               SLURM_JOB_NODELIST="gpu[01-02]", SLURM_SUBMIT_DIR=str(REPO))
    done = subprocess.run(["bash", SCRIPT, *overrides], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    return argv_file.read_text().splitlines()


def test_the_script_parses():
    subprocess.run(["bash", "-n", SCRIPT], check=True)


def test_one_task_per_gpu_a_warning_signal_before_the_limit_and_a_requeue():
    found = directives()
    assert found["ntasks-per-node"] == found["gpus-per-node"] == "8"
    signal, lead_s = found["signal"].split("@")
    assert signal == "USR1" and int(lead_s) >= 120 and "requeue" in found and found["open-mode"] == "append"


def test_srun_starts_tokenpo_train_as_one_rank_per_task_in_a_run_dir_of_the_job(tmp_path):
    argv = recorded_srun(tmp_path, "trainer.max_steps=100", "seed=1")
    assert argv[:4] == ["--kill-on-bad-exit=1", ".venv/bin/python", "-m", "tokenpo.train"]
    assert argv[4:] == [f"experiment={EXPERIMENT}", "trainer.nproc=1", "logger.mode=online",
                        f"hydra.run.dir='{REPO}/outputs/slurm/dapo_7b-4242'", "trainer.max_steps=100", "seed=1"]


@pytest.mark.skipif(not (REPO / "conf" / "experiment" / f"{EXPERIMENT}.yaml").exists(),
                    reason=f"experiment={EXPERIMENT} is not in conf/ yet")
def test_the_command_composes_into_a_plan_for_8_ranks(tmp_path):
    overrides = recorded_srun(tmp_path)[4:]
    done = subprocess.run([sys.executable, "-m", "tokenpo.plan", *overrides, "--world-size", "8"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "8 process(es)" in done.stdout and "rollout (vllm)" in done.stdout

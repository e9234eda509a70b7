"""Sweeps through Hydra's launcher and sweeper plugins (tokenpo[cluster]).

Fast: the start-up checks (one line before any job starts), resuming a sweep's jobs, the objective a job returns,
submitit's environment taken as torchrun's. Slow (`-m slow`): the real plugins end to end on the tiny model
(scripts/check_sweeps.sh prints the same comparisons at a larger size, with wall times).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from support.config import SMALL, compose_tree
from support.env import RANK_VARS, REPO, cli_env
from tokenpo import CONF_DIR
from tokenpo import preflight
from tokenpo.compare.identical import deterministic_rows, differences
from tokenpo.errors import ConfigError
from tokenpo.train import is_run_control
from tokenpo.trainer.processes import sweep
from tokenpo.trainer.processes.launch import adopt_submitit_environment


def start_error(*argv: str) -> str:
    with pytest.raises(ConfigError) as err:
        preflight.check_command_line(CONF_DIR, "train", list(argv))
    return str(err.value)


@pytest.mark.parametrize("argv, message", [
    (["hydra/launcher=submitit_local", "trainer.nproc=2"],
     "hydra.launcher.tasks_per_node=1 but trainer.nproc=2: a submitit job runs one task per training process"),
    (["hydra/launcher=submitit_local", "trainer.nproc=2", "hydra.launcher.tasks_per_node=2",
      "hydra.launcher.gpus_per_node=1"], "hydra.launcher.gpus_per_node=1 but trainer.nproc=2: one GPU per process"),
    (["hydra/launcher=submitit_local", "hydra.launcher.tasks_per_node=2", "trainer.nproc=1,2"],
     "trainer.nproc is swept but a submitit launcher fixes its tasks per node"),
    (["trainer.objective=eval/arith/pass@4"], "trainer.objective=eval/arith/pass@4: this run logs no such metric"),
    (["trainer.objective=reward/mean"], "(available: eval/accuracy, eval/arith/num_problems,"),
])
def test_a_sweep_that_cannot_run_stops_in_one_line(argv, message):
    error = start_error("-m", "model=tiny", "seed=0,1", *argv)
    assert message in error and "\n" not in error


def test_the_slurm_preset_follows_trainer_nproc_and_needs_sbatch():
    if shutil.which("sbatch"):
        pytest.skip("a Slurm machine: the preset submits")
    error = start_error("-m", "model=tiny", "hydra/launcher=slurm", "trainer.nproc=4")
    assert error.startswith("hydra/launcher=slurm submits Slurm jobs, but this machine has no sbatch")
    launcher = compose_tree("train", ["hydra/launcher=slurm", "trainer.nproc=4"], return_hydra_config=True).hydra.launcher
    assert (launcher.tasks_per_node, launcher.gpus_per_node, launcher.max_num_timeout) == (4, 4, 5)


def test_sweep_checks_pass_for_a_consistent_sweep():
    preflight.check_command_line(CONF_DIR, "train", [
        "-m", "model=tiny", "seed=0,1", "hydra/launcher=submitit_local", "trainer.nproc=2",
        "hydra.launcher.tasks_per_node=2", "eval.n=4", "eval.pass_k=[1,4]", "trainer.objective=eval/arith/pass@4"])
    preflight.check_command_line(CONF_DIR, "train", ["-m", "model=tiny", "seed=0,1", "hydra/launcher=joblib"])


def test_a_plugin_library_that_does_not_import_is_named_with_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "joblib", None)  # import joblib raises ImportError
    error = start_error("-m", "model=tiny", "seed=0,1", "hydra/launcher=joblib")
    assert error.startswith("hydra/launcher=joblib needs joblib (") and error.endswith(preflight.INSTALL_CLUSTER)


def test_a_plugin_that_is_not_installed_is_named_with_the_extra(monkeypatch):
    # as if tokenpo[cluster] shipped a launcher called 'ray' that is not installed here
    monkeypatch.setitem(preflight.CLUSTER_PLUGINS, "hydra/launcher", {"ray": "ray"})
    error = start_error("-m", "model=tiny", "hydra/launcher=ray")
    assert "hydra/launcher=ray: no such option in config group 'hydra/launcher'" in error
    assert error.endswith(f"a Hydra plugin, {preflight.INSTALL_CLUSTER}")
    assert preflight.plugin_hint("hydra/launcher", "hydra/launcher/ray").endswith(preflight.INSTALL_CLUSTER)
    assert preflight.plugin_hint("hydra/launcher", "basic") == ""


def write_run(run_dir: Path, overrides: list[str], steps: int, interrupted: bool = False) -> None:
    (run_dir / ".hydra").mkdir(parents=True)
    (run_dir / ".hydra" / "overrides.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(overrides)))
    (run_dir / "summary.json").write_text(json.dumps({"steps": steps, "interrupted": interrupted}))
    rows = [{"step": 0, "eval/accuracy": 0.25}, {"step": steps, "eval/accuracy": 0.5, "loss": 1.0}]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))


def test_a_finished_run_is_recognised_by_its_overrides_and_steps(tmp_path):
    write_run(tmp_path / "done", ["seed=1", "trainer.nproc=2", "logger.mode=disabled"], steps=3)
    write_run(tmp_path / "stopped", ["seed=1"], steps=2, interrupted=True)
    assert sweep.same_job(tmp_path / "done", ["seed=1"], is_run_control) is True  # run-control keys aside
    assert sweep.same_job(tmp_path / "done", ["seed=2"], is_run_control) is False
    assert sweep.same_job(tmp_path / "empty", ["seed=1"], is_run_control) is None
    assert sweep.finished_summary(tmp_path / "done", 3)["steps"] == 3
    assert sweep.finished_summary(tmp_path / "done", 4) is None  # more steps asked for: not finished
    assert sweep.finished_summary(tmp_path / "stopped", 2) is None
    (tmp_path / "stopped" / "summary.json").write_text("{cut sh")
    assert sweep.finished_summary(tmp_path / "stopped", 2) is None


def test_the_objective_is_the_metric_at_the_last_logged_step(tmp_path):
    write_run(tmp_path, ["seed=0"], steps=3)
    assert sweep.objective_value(tmp_path, "eval/accuracy") == 0.5
    assert sweep.objective_value(tmp_path, "reward/mean") is None
    assert sweep.objective_value(tmp_path, None) is None
    assert sweep.objective_value(tmp_path / "missing", "eval/accuracy") is None


def test_parallel_jobs_split_the_cores(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    launcher = OmegaConf.create
    assert sweep.job_threads(launcher({"n_jobs": 2}), nproc=1) == 4
    assert sweep.job_threads(launcher({"n_jobs": 2}), nproc=2) == 2
    assert sweep.job_threads(launcher({"n_jobs": -1}), nproc=1) == 1  # joblib: every core runs a job
    assert sweep.job_threads(launcher({"n_jobs": 16}), nproc=1) == 1
    assert sweep.job_threads(launcher({"cpus_per_task": 6, "tasks_per_node": 2}), nproc=2) == 6
    assert sweep.job_threads(launcher({"_target_": "basic"}), nproc=1) == 0


def test_a_sweep_dirs_own_files_are_moved_aside_when_a_new_sweep_would_change_them(tmp_path):
    config = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}}, "seed": 0})
    (tmp_path / "multirun.yaml").write_text(OmegaConf.to_yaml(config))
    sweep.SweepDirFiles().on_multirun_start(config)
    assert (tmp_path / "multirun.yaml").is_file() and not list(tmp_path.glob("sweep.previous-*"))  # same command
    (tmp_path / "optimization_results.yaml").write_text("best_value: 0.5\n")
    changed = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}}, "seed": 1})
    sweep.SweepDirFiles().on_multirun_start(changed)
    [aside] = tmp_path.glob("sweep.previous-*")
    assert sorted(p.name for p in aside.iterdir()) == ["multirun.yaml", "optimization_results.yaml"]
    assert OmegaConf.load(aside / "multirun.yaml").seed == 0
    assert not (tmp_path / "multirun.yaml").exists()


@pytest.fixture
def clean_rank_env(monkeypatch):
    for var in (*RANK_VARS, "CUDA_VISIBLE_DEVICES"):
        # set first, so monkeypatch records the variable and removes what the test's code exports (a delenv of an
        # absent variable records nothing: WORLD_SIZE=2 would leak and hang later tests' process groups)
        monkeypatch.setenv(var, "")
        monkeypatch.delenv(var)
    return monkeypatch


def test_a_submitit_local_task_gets_torchruns_variables(clean_rank_env):
    for key, value in dict(SUBMITIT_EXECUTOR="local", SUBMITIT_LOCAL_JOB_ID="4321", SUBMITIT_LOCAL_NTASKS="2",
                           SUBMITIT_LOCAL_JOB_NUM_NODES="1", SUBMITIT_LOCAL_NODEID="0", SUBMITIT_LOCAL_GLOBALID="1",
                           SUBMITIT_LOCAL_LOCALID="1").items():
        clean_rank_env.setenv(key, value)
    assert adopt_submitit_environment()
    assert {var: os.environ[var] for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")} == \
        {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}
    assert os.environ["MASTER_ADDR"] == socket.gethostname() and 20000 <= int(os.environ["MASTER_PORT"]) <= 60000
    assert "CUDA_VISIBLE_DEVICES" not in os.environ
    assert not adopt_submitit_environment()  # WORLD_SIZE set now: a launcher's own variables win


def test_a_two_node_slurm_task_gets_its_rank_and_the_first_node_as_master(clean_rank_env):
    for key, value in dict(SUBMITIT_EXECUTOR="slurm", SLURM_JOB_ID="77", SLURM_NTASKS="8", SLURM_JOB_NUM_NODES="2",
                           SLURM_NODEID="1", SLURM_PROCID="6", SLURM_LOCALID="2",
                           SLURM_JOB_NODELIST="gpu[07-08]").items():
        clean_rank_env.setenv(key, value)
    assert adopt_submitit_environment()
    assert [os.environ[var] for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR")] == \
        ["6", "2", "8", "4", "gpu07"]


def test_one_task_or_no_submitit_leaves_the_environment_alone(clean_rank_env):
    clean_rank_env.delenv("SUBMITIT_EXECUTOR", raising=False)
    assert not adopt_submitit_environment()
    for key, value in dict(SUBMITIT_EXECUTOR="local", SUBMITIT_LOCAL_JOB_ID="1", SUBMITIT_LOCAL_NTASKS="1",
                           SUBMITIT_LOCAL_JOB_NUM_NODES="1", SUBMITIT_LOCAL_NODEID="0", SUBMITIT_LOCAL_GLOBALID="0",
                           SUBMITIT_LOCAL_LOCALID="0").items():
        clean_rank_env.setenv(key, value)
    assert not adopt_submitit_environment() and "WORLD_SIZE" not in os.environ


# ---- end to end with the real plugins (slow) ----

TINY = [*SMALL, "trainer.max_steps=3", "trainer.save_every=1"]
SWEEP_2x2 = ["-m", "algorithm=grpo,dapo", "seed=0,1"]


def train(*argv: str, timeout: float = 900) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "tokenpo.train", *argv], cwd=REPO, env=cli_env(),
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


def job_logs(sweep_dir: Path) -> str:
    return "\n".join(path.read_text() for path in sorted(sweep_dir.glob("[0-9]*/train.log")))


@pytest.fixture(scope="module")
def sequential(tmp_path_factory) -> Path:
    """The 2 x 2 sweep one job after another (Hydra's basic launcher): the reference of the others."""
    out = tmp_path_factory.mktemp("sequential") / "sweep"
    train(*SWEEP_2x2, *TINY, f"hydra.sweep.dir={out}")
    return out


@pytest.mark.slow
def test_joblib_runs_jobs_side_by_side_with_the_sequential_numbers(sequential, tmp_path):
    train(*SWEEP_2x2, *TINY, "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", f"hydra.sweep.dir={tmp_path}")
    for job in "0123":
        assert differences(sequential / job, tmp_path / job) == [], job
        rows = deterministic_rows(tmp_path / job)
        assert sorted(rows) == [0, 1, 2, 3] and rows[3]["grad_norm"] > 0


@pytest.mark.slow
def test_a_sweep_killed_during_job_3_resumes_on_the_same_command(sequential, tmp_path):
    argv = [*SWEEP_2x2, *TINY, f"hydra.sweep.dir={tmp_path}"]
    proc = subprocess.Popen([sys.executable, "-m", "tokenpo.train", *argv], cwd=REPO, env=cli_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 900
    while not (tmp_path / "2" / "checkpoints" / "step_000001").is_dir():
        assert proc.poll() is None and time.monotonic() < deadline, "the sweep ended before job 3 saved step 1"
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    finished = {job: (tmp_path / job / "metrics.jsonl").read_bytes() for job in "01"}
    multirun = (tmp_path / "multirun.yaml").read_text()
    train(*argv)
    logs = job_logs(tmp_path)
    assert "job 0: skipped: finished" in logs and "job 1: skipped: finished" in logs
    assert "job 2: resumed" in logs and "resumed from" in (tmp_path / "2" / "train.log").read_text()
    assert "job 3: started" in logs and "job 3: resumed" not in logs
    assert {job: (tmp_path / job / "metrics.jsonl").read_bytes() for job in "01"} == finished  # untouched
    assert (tmp_path / "multirun.yaml").read_text() == multirun and not list(tmp_path.glob("sweep.previous-*"))
    for job in "0123":
        assert differences(sequential / job, tmp_path / job) == [], job


@pytest.mark.slow
@pytest.mark.multiproc
def test_submitit_local_sweep_and_a_two_task_job_that_trains_as_one_run(tmp_path):
    # a 2-point sweep through submitit's local executor, then the same command again: both skipped
    points = tmp_path / "points"
    train("-m", "seed=0,1", *TINY, "hydra/launcher=submitit_local", f"hydra.sweep.dir={points}")
    written = {job: (points / job / "metrics.jsonl").read_bytes() for job in "01"}
    assert all(sorted(deterministic_rows(points / job)) == [0, 1, 2, 3] for job in "01")
    train("-m", "seed=0,1", *TINY, "hydra/launcher=submitit_local", f"hydra.sweep.dir={points}")
    assert job_logs(points).count("skipped: finished") == 2
    assert {job: (points / job / "metrics.jsonl").read_bytes() for job in "01"} == written
    # a fresh sweep on request: every job runs again, the earlier results and multirun.yaml set aside
    train("-m", "seed=0,1", *TINY, "hydra/launcher=submitit_local", "trainer.resume=none", f"hydra.sweep.dir={points}")
    assert all(len(list((points / job).glob("results.previous-*"))) == 1 for job in "01")
    [aside] = points.glob("sweep.previous-*")
    assert (aside / "multirun.yaml").is_file() and "trainer.resume=none" in (points / "multirun.yaml").read_text()
    assert all(differences(points / job, next((points / job).glob("results.previous-*"))) == [] for job in "01")
    # one job of 2 tasks: one run, rank 0 writing it, the same numbers as trainer.nproc=2
    tasks, nproc = tmp_path / "tasks", tmp_path / "nproc"
    train("-m", *TINY, "trainer.nproc=2", "hydra/launcher=submitit_local", "hydra.launcher.tasks_per_node=2",
          f"hydra.sweep.dir={tasks}")
    train(*TINY, "trainer.nproc=2", f"hydra.run.dir={nproc}")
    assert sorted(p.name for p in tasks.iterdir() if not p.name.startswith(".")) == ["0", "multirun.yaml"]
    assert json.loads((tasks / "0" / "environment.json").read_text())[-1]["processes"] == 2
    assert differences(tasks / "0", nproc) == []


@pytest.mark.slow
@pytest.mark.multiproc
def test_optuna_search_gets_the_objective_from_two_process_trials_and_survives_a_failed_one(tmp_path):
    # two reward functions: the second does not exist, so its trial fails in its job, before training; the random
    # sampler at seed 0 draws the failing one, then the good one (the grid sampler cannot take a failed last trial:
    # hydra-optuna-sweeper 1.3 then stops with Optuna's "Study.stop" error). The swept key must not also be set
    # plainly: Optuna would take the plain value as fixed and search nothing
    proc = train("-m", *(o for o in TINY if not o.startswith("reward.fn=")), "trainer.nproc=2", "hydra/sweeper=optuna",
                 "hydra/sweeper/sampler=random", "hydra.sweeper.sampler.seed=0", "hydra.sweeper.n_trials=2",
                 "hydra.sweeper.max_failure_rate=1.0", "hydra.sweeper.direction=maximize",
                 "reward.fn=choice(trainer_rewards:even_length,trainer_rewards:no_such_fn)",
                 "trainer.objective=eval/arith/wrong_frac", f"hydra.sweep.dir={tmp_path}")
    assert "Failed experiment" in proc.stderr + proc.stdout
    result = OmegaConf.load(tmp_path / "optimization_results.yaml")
    # the failed trial's job dir holds nothing of a run
    [good] = [d for d in tmp_path.glob("[0-9]*") if (d / ".hydra" / "overrides.yaml").is_file()]
    assert "reward.fn=trainer_rewards:even_length" in (good / ".hydra" / "overrides.yaml").read_text()
    rows = deterministic_rows(good)
    assert result.best_params["reward.fn"] == "trainer_rewards:even_length"
    assert result.best_value == rows[3]["eval/arith/wrong_frac"]  # rank 0's record, returned by the job process
    assert "trainer_rewards:no_such_fn" in (proc.stderr + proc.stdout)
    # tokenpo.compare reads the study's trials like any sweep's runs
    compare = subprocess.run([sys.executable, "-m", "tokenpo.compare", str(tmp_path), "--no-figures", "--out",
                              str(tmp_path / "compare")], cwd=REPO, env=cli_env(), capture_output=True, text=True)
    assert compare.returncode == 0, compare.stderr[-2000:]
    assert len((tmp_path / "compare" / "summary.csv").read_text().splitlines()) == 2  # a header, the one trial
    # every eval key the run logged is one trainer.objective accepts
    from tokenpo.config import build_config
    tree = OmegaConf.load(good / ".hydra" / "config.yaml")
    logged = {key for row in rows.values() for key in row if key.startswith("eval/")}
    assert logged <= set(sweep.loggable_objectives(build_config(tree)))

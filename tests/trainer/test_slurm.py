"""`srun python -m tokenpo.train` with several tasks: Slurm's task variables become one run's ranks (or a one-line
refusal), and the local device count is checked before workers start. Slurm itself is a stand-in here (its
variables set by hand); no Slurm cluster has run this."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from support.config import SMALL
from support.env import RANK_VARS, cli_env
from support.metrics import by_step, read_metrics
from tokenpo.deepspeed.dist import free_port
from tokenpo.errors import ConfigError
from tokenpo.trainer.processes import launch
from tokenpo.trainer.processes.launch import Ranks, first_host, slurm_ranks, tasks_on_node

# task 6 of an 8-task job on two nodes (4 tasks each), as srun sets it
TASK_6 = {"SLURM_NTASKS": "8", "SLURM_PROCID": "6", "SLURM_LOCALID": "2", "SLURM_NODEID": "1",
          "SLURM_TASKS_PER_NODE": "4(x2)", "SLURM_NODELIST": "gpu[07-08]", "SLURM_JOB_ID": "4812345"}


@pytest.mark.parametrize("nodelist, host", [
    ("node[01-04,07]", "node01"), ("a1,b[2-3]", "a1"), ("gpu-001", "gpu-001"), ("n[7,3]", "n7"),
    ("rack[1-2]-gpu[3-4],c1", "rack1-gpu3"),
])
def test_the_first_host_of_a_compressed_node_list(nodelist, host):
    assert first_host(nodelist) == host


@pytest.mark.e2e
def test_a_task_without_a_node_list_is_one_line(tmp_path):
    # a stand-in without SLURM_NODELIST: the start stops in one line, before Hydra reads the command line
    env = {k: v for k, v in cli_env(**TASK_6).items() if k != "SLURM_NODELIST"}
    result = subprocess.run([sys.executable, "-m", "tokenpo.train", "model=tiny"], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == ("tokenpo: error: SLURM_NODELIST='' names no host: set "
                                                      "MASTER_ADDR to the first node's address")


def test_tasks_per_node_with_repeats():
    assert [tasks_on_node("4(x2),3", node) for node in range(3)] == [4, 4, 3]
    assert tasks_on_node("2", 0) == 2


def test_a_slurm_task_becomes_a_rank_of_one_run():
    assert slurm_ranks(TASK_6) == Ranks(rank=6, local_rank=2, world_size=8, local_world_size=4, master_addr="gpu07",
                                        master_port=15000 + 2345)
    # a master address or port set for the job wins (Lightning's SLURMEnvironment reads them the same way)
    assert slurm_ranks({**TASK_6, "MASTER_ADDR": "head", "MASTER_PORT": "29400"}).master_addr == "head"
    assert slurm_ranks({**TASK_6, "MASTER_PORT": "29400"}).master_port == 29400


@pytest.mark.parametrize("env", [
    {**TASK_6, "SLURM_NTASKS": "1"},  # one task: a run of one process
    {k: v for k, v in TASK_6.items() if k != "SLURM_PROCID"},  # salloc's shell, not a task
    {**TASK_6, "WORLD_SIZE": "16", "RANK": "3"},  # torchrun inside the job sets its own ranks
    {**TASK_6, "LOCAL_RANK": "0"},
])
def test_no_slurm_ranks_outside_a_task_of_several_or_under_a_launcher(env):
    assert slurm_ranks(env) is None


@pytest.fixture
def clean_env(monkeypatch):
    for var in (*RANK_VARS, *TASK_6):
        monkeypatch.setenv(var, "")  # recorded, so monkeypatch removes what the code under test exports
        monkeypatch.delenv(var)
    return monkeypatch


def test_adopting_exports_torchruns_variables(clean_env):
    for key, value in TASK_6.items():
        clean_env.setenv(key, value)
    assert launch.adopt_slurm_environment()
    assert {var: os.environ[var] for var in RANK_VARS} == {
        "RANK": "6", "LOCAL_RANK": "2", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4", "MASTER_ADDR": "gpu07",
        "MASTER_PORT": "17345"}
    assert not launch.adopt_slurm_environment()  # WORLD_SIZE set now


def test_local_workers_beyond_the_visible_devices_are_refused_in_one_line():
    with pytest.raises(ConfigError) as err:
        launch.check_local_devices(4, 2)
    assert str(err.value) == ("trainer.nproc=4 but this machine has 2 visible CUDA device(s) (CUDA_VISIBLE_DEVICES): "
                              "one per process")
    launch.check_local_devices(2, 2)
    launch.check_local_devices(4, 0)  # no CUDA: CPU processes


def slurm_task(rank: int, port: int) -> dict[str, str]:
    return cli_env(SLURM_NTASKS="2", SLURM_PROCID=str(rank), SLURM_LOCALID=str(rank), SLURM_NODEID="0",
                   SLURM_TASKS_PER_NODE="2", SLURM_NODELIST="localhost", SLURM_JOB_ID="991", MASTER_PORT=str(port))


@pytest.mark.e2e
def test_srun_tasks_asking_for_local_workers_are_refused_in_one_line(tmp_path):
    result = subprocess.run([sys.executable, "-m", "tokenpo.train", *SMALL, "trainer.nproc=2",
                             f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path, env=slurm_task(0, 1),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("tokenpo: error:")]
    assert errors == ["tokenpo: error: trainer.nproc=2 starts local workers itself; under an external launcher "
                      "(WORLD_SIZE=2) leave trainer.nproc at 1"]
    assert not (tmp_path / "run" / "resolved_config.json").exists()


@pytest.mark.slow
@pytest.mark.multiproc
def test_two_srun_tasks_train_as_one_run(tmp_path):
    port = free_port()
    cmd = [sys.executable, "-m", "tokenpo.train", *SMALL, "trainer.max_steps=2", f"hydra.run.dir={tmp_path / 'run'}"]
    tasks = [subprocess.Popen(cmd, cwd=tmp_path, env=slurm_task(rank, port), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for rank in range(2)]
    outputs = [task.communicate(timeout=600)[0] for task in tasks]
    assert [task.returncode for task in tasks] == [0, 0], outputs[0][-3000:] + outputs[1][-3000:]
    run_dir = tmp_path / "run"
    assert sorted(by_step(read_metrics(run_dir))) == [0, 1, 2]
    assert json.loads((run_dir / "environment.json").read_text())[-1]["processes"] == 2
    assert "".join(outputs).count("step 2/2 |") == 1  # rank 0 alone logs

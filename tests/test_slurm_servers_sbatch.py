"""scripts/slurm/servers_hetjob.sbatch and servers_split.sbatch (docs/cluster.md, "vLLM servers beside the trainer"),
run as Slurm's batch step would run them, with a recording `srun` and an `scontrol` that lists host names on PATH:
a server step with the flags tokenpo's own server gets (tokens in and out, processed log-probs, vLLM's generation
config, the NCCL weight transfer) that ignores SIGUSR1, on the nodes the trainer's step does not use; the trainer's
step as one rank per task with every server's URL and its first node as the transfer address; the recorded command
composes into a memory plan."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
HETJOB = REPO / "scripts" / "slurm" / "servers_hetjob.sbatch"
SPLIT = REPO / "scripts" / "slurm" / "servers_split.sbatch"
EXPERIMENT = "paper/dapo_qwen2_5_math_7b"
VLLM_SERVER = ["-m", "vllm.entrypoints.openai.api_server"]
# `scontrol show hostnames A,B` prints A and B (the tests' node lists are plain comma lists)
SCONTROL = '#!/bin/sh\n[ "$1 $2" = "show hostnames" ] || exit 1\nprintf "%s\\n" $(echo "$3" | tr "," " ")\n'
# each srun call's argv as one JSON line; the trainer's step (in the foreground) returns once the server's step (in
# the background, killed when the script exits) has written its line
SRUN = """#!/usr/bin/env python3
import json, os, sys, time
log = os.environ["SRUN_LOG"]
deadline = time.monotonic() + 30
while "tokenpo.train" in sys.argv and time.monotonic() < deadline and (
        not os.path.exists(log) or "api_server" not in open(log).read()):
    time.sleep(0.05)
with open(log, "a") as out:
    out.write(json.dumps(sys.argv[1:]) + "\\n")
"""


def srun_calls(tmp_path: Path, script: Path, env: dict[str, str], *overrides: str) -> list[list[str]]:
    """The argv of each srun the script runs, in order, under a job's environment."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("srun", SRUN), ("scontrol", SCONTROL)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    log = tmp_path / "srun.jsonl"
    job = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", SRUN_LOG=str(log), SLURM_JOB_ID="4242",
               SLURM_SUBMIT_DIR=str(REPO), **env)
    done = subprocess.run(["bash", script, *overrides], cwd=tmp_path, env=job, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in log.read_text().splitlines()]


def split(calls: list[list[str]]) -> tuple[list[str], list[str]]:
    """(the server step's argv, the trainer step's argv)."""
    servers = [argv for argv in calls if "vllm.entrypoints.openai.api_server" in argv]
    trainers = [argv for argv in calls if "tokenpo.train" in argv]
    assert len(servers) == len(trainers) == 1 and len(calls) == 2
    return servers[0], trainers[0]


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def directives(script: Path) -> list[str]:
    return re.findall(r"^#SBATCH (.+)$", script.read_text(), re.M)


def check_server(argv: list[str]) -> None:
    """The flags docs/rollout.md names for a server given by URL, as tokenpo's launch gives its own server."""
    from tokenpo.rollout.config import RolloutConfig, ServerConfig
    from tokenpo.rollout.server.launch import server_command

    own = server_command(RolloutConfig(server=ServerConfig(devices=(6, 7))), "model", "bfloat16", "nccl")
    for name in ("--logprobs-mode", "--generation-config", "--weight-transfer-config", "--load-format"):
        assert flag(argv, name) == flag(own, name), name
    assert "--enable-scale-out" in argv and "--enable-scale-out" in own
    assert json.loads(flag(argv, "--weight-transfer-config")) == {"backend": "nccl"}
    assert "VLLM_SERVER_DEV_MODE=1" in argv and flag(argv, "--host") == "0.0.0.0"
    wrapper = argv[argv.index("-c") + 1]
    assert shlex.split(wrapper)[:3] == ["trap", "", "USR1;"], "the server must ignore Slurm's SIGUSR1"


def test_the_scripts_parse():
    for script in (HETJOB, SPLIT):
        subprocess.run(["bash", "-n", script], check=True)


def test_both_warn_before_the_limit_and_requeue():
    for script in (HETJOB, SPLIT):
        found = directives(script)
        assert "--signal=USR1@900" in found and "--requeue" in found and "--open-mode=append" in found


def test_the_hetjob_has_a_trainer_component_and_a_server_component():
    found = directives(HETJOB)
    assert found.count("hetjob") == 1
    trainer, server = found[:found.index("hetjob")], found[found.index("hetjob") + 1:]
    assert "--ntasks-per-node=8" in trainer and "--gpus-per-node=8" in trainer
    assert "--ntasks-per-node=1" in server and "--gpus-per-node=8" in server


def test_the_hetjob_serves_on_component_1_and_trains_on_component_0(tmp_path):
    server, trainer = split(srun_calls(tmp_path, HETJOB, {"SLURM_JOB_NODELIST_HET_GROUP_0": "gpu01",
                                                          "SLURM_JOB_NODELIST_HET_GROUP_1": "gpu09"}, "seed=1"))
    assert server[0] == "--het-group=1" and trainer[:2] == ["--het-group=0", "--kill-on-bad-exit=1"]
    check_server(server)
    assert flag(server, "--port") == "8100" and flag(server, "--data-parallel-size") == "8"
    start = trainer.index("-m")
    assert trainer[start:] == ["-m", "tokenpo.train", f"experiment={EXPERIMENT}", "trainer.nproc=1",
                               "rollout=vllm_server", "rollout.server.urls=[http://gpu09:8100]",
                               "rollout.server.transfer_address=gpu01", "logger.mode=online",
                               f"hydra.run.dir='{REPO}/outputs/slurm/dapo_7b_het-4242'", "seed=1"]


def test_the_split_job_serves_on_its_last_nodes_and_trains_on_the_first(tmp_path):
    env = {"SLURM_JOB_NODELIST": "gpu01,gpu02,gpu03,gpu04", "SLURM_GPUS_PER_NODE": "h100:8", "SERVER_NODES": "2",
           "SERVER_TP": "2"}
    server, trainer = split(srun_calls(tmp_path, SPLIT, env))
    assert server[:4] == ["--nodes=2", "--relative=2", "--ntasks=2", "--ntasks-per-node=1"]
    check_server(server)
    assert flag(server, "--tensor-parallel-size") == "2" and flag(server, "--data-parallel-size") == "4"
    assert trainer[:5] == ["--nodes=2", "--relative=0", "--ntasks=16", "--ntasks-per-node=8", "--gpus-per-node=8"]
    assert "rollout.server.urls=[http://gpu03:8100,http://gpu04:8100]" in trainer
    assert "rollout.server.transfer_address=gpu01" in trainer and "trainer.nproc=1" in trainer


def test_the_split_job_refuses_to_leave_no_trainer_node(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(SCONTROL)
    (bin_dir / "scontrol").chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", SLURM_JOB_ID="4242", SLURM_SUBMIT_DIR=str(REPO),
               SLURM_JOB_NODELIST="gpu01", SERVER_NODES="1")
    done = subprocess.run(["bash", SPLIT], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "leave no trainer node" in done.stderr


@pytest.mark.skipif(not (REPO / "conf" / "experiment" / f"{EXPERIMENT}.yaml").exists(),
                    reason=f"experiment={EXPERIMENT} is not in conf/ yet")
def test_the_trainer_command_composes_into_a_plan_for_16_ranks(tmp_path):
    env = {"SLURM_JOB_NODELIST": "gpu01,gpu02,gpu03", "SLURM_GPUS_PER_NODE": "8"}
    _, trainer = split(srun_calls(tmp_path, SPLIT, env))
    overrides = trainer[trainer.index("tokenpo.train") + 1:]
    done = subprocess.run([sys.executable, "-m", "tokenpo.plan", *overrides, "--world-size", "16"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "16 process(es)" in done.stdout and "rollout (vllm)" not in done.stdout

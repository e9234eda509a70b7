"""`rollout=vllm_server` with two trainer processes under ZeRO-3, against a stand-in server (standin_vllm.py) that
speaks vLLM's weight-transfer routes over tokenpo's gloo wire: rank 0 pushes while every rank gathers the weights
module by module (a collective), in several buckets, with the ranks' responses of different lengths. Each version
the server received is the policy's (version 0 the initial model, the last the exported final one); a server that
dies in the middle of a push is one line on every rank, a checkpoint and an exit, not a hang; the same command on
a new server resumes and pushes the checkpoint's weights before the first request."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from support.config import SMALL, train_config
from support.env import cli_env
from support.metrics import by_step, read_metrics
from tokenpo.deepspeed.dist import free_port
from tokenpo.rollout.server import process

pytestmark = [pytest.mark.e2e, pytest.mark.multiproc]

HERE = Path(__file__).resolve().parent
STEPS = 3
# responses of 1..24 tokens (the stand-in draws each length), several buckets of a tiny model's ~0.2 MiB
COMMON = [*SMALL, "rollout=vllm_server", "rollout.max_new_tokens=24", "rollout.server.bucket_mib=0.02",
          "rollout.server.transfer_address=127.0.0.1", "rollout.server.push_timeout_s=60", "trainer.nproc=2",
          "deepspeed=zero3", f"trainer.max_steps={STEPS}", "trainer.save_every=1", "trainer.lr=1e-2",
          "trainer.warmup_steps=0", "eval.max_problems=2", "eval.before_training=false"]


def vocab_size() -> int:
    from tokenpo.models.loading import model_description

    return model_description(train_config(*SMALL).model)[0].vocab_size


def standin(tmp_path: Path, port: int, name: str, *flags: str) -> tuple[process.Server, Path]:
    record = tmp_path / f"{name}.json"
    command = (sys.executable, str(HERE / "standin_vllm.py"), "--port", str(port), "--vocab", str(vocab_size()),
               "--record", str(record), *flags)
    spec = process.ServerSpec(f"stand-in vLLM {name}", command, "127.0.0.1", port, tmp_path / f"{name}.log",
                              {"PYTHONPATH": str(HERE.parents[2])})
    server = process.start(spec)
    process.wait_ready(server, 60)
    return server, record


def train(run_dir: Path, port: int, *extra: str, timeout: float = 600) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "tokenpo.train", *COMMON, f"rollout.server.urls=[http://127.0.0.1:{port}]",
               f"rollout.server.transfer_port={free_port()}", f"hydra.run.dir={run_dir}", *extra]
    return subprocess.run(command, cwd=HERE, env=cli_env(), capture_output=True, text=True, timeout=timeout)


def sums(module: torch.nn.Module) -> dict[str, float]:
    return {name: tensor.double().sum().item() for name, tensor in module.state_dict().items()}


def assert_same(received: dict[str, float], expected: dict[str, float]) -> None:
    assert set(received) <= set(expected) and len(received) >= len(expected) - 1  # a tied head sent once or twice
    for name, value in received.items():
        assert value == pytest.approx(expected[name], rel=1e-5, abs=1e-5), name


@pytest.mark.parametrize("k", [0, 1])
def test_two_ranks_under_zero3_push_every_version_whole_in_buckets(tmp_path, k):
    from transformers import AutoModelForCausalLM

    from tokenpo.models.loading import load_model

    port = free_port()
    server, record = standin(tmp_path, port, "server")
    try:
        done = train(tmp_path / "run", port, f"rollout.async.max_staleness={k}")
    finally:
        process.stop(server)
    assert done.returncode == 0, done.stderr[-3000:]
    pushes = json.loads(record.read_text())
    assert [push["version"] for push in pushes["pushes"]] == [str(v) for v in range(STEPS + 1)]
    assert all(push["buckets"] > 1 and push["mode"] == "keep" for push in pushes["pushes"])
    assert len(set(pushes["lengths"])) > 5  # the ranks' responses of many lengths
    cfg = train_config(*SMALL)
    initial, final = load_model(cfg.model, cfg.seed)[1], AutoModelForCausalLM.from_pretrained(tmp_path / "run/final")
    assert_same(pushes["pushes"][0]["sums"], sums(initial))
    assert_same(pushes["pushes"][-1]["sums"], sums(final))
    assert pushes["pushes"][1]["sums"] != pushes["pushes"][0]["sums"]  # the update moved the weights
    metrics = by_step(read_metrics(tmp_path / "run"))
    assert sorted(metrics) == [1, 2, 3] and metrics[3].get("async/staleness", 0.0) == k


def test_a_server_dead_mid_push_stops_both_ranks_with_a_checkpoint_and_the_same_command_resumes(tmp_path):
    port = free_port()
    server, record = standin(tmp_path, port, "dies", "--die-in-push", "2", "--die-at-bucket", "1")
    started = time.monotonic()
    try:
        done = train(tmp_path / "run", port, "rollout.async.max_staleness=1", timeout=300)
    finally:
        process.stop(server)
    assert done.returncode == 2, done.stderr[-3000:]
    assert time.monotonic() - started < 240
    last = done.stderr.strip().splitlines()[-1]
    assert f"pushing policy version 2 to http://127.0.0.1:{port}" in last
    assert "the run saved its checkpoint at step 2" in last
    assert (tmp_path / "run/checkpoints/step_000002").is_dir()
    assert [push["version"] for push in json.loads(record.read_text())["pushes"]] == ["0", "1"]

    server, record = standin(tmp_path, port, "new")
    try:
        done = train(tmp_path / "run", port, "rollout.async.max_staleness=1")
    finally:
        process.stop(server)
    assert done.returncode == 0, done.stderr[-3000:]
    # the checkpoint's weights first, then the last step's update
    assert [push["version"] for push in json.loads(record.read_text())["pushes"]] == ["2", "3"]
    assert sorted(by_step(read_metrics(tmp_path / "run"))) == [1, 2, 3]


def test_dapo_rounds_and_lora_train_ahead_on_two_ranks(tmp_path):
    """DAPO's extra rounds (no oversampling: one round rarely has enough mixed groups) run on the server; a LoRA
    policy's pushes are its merged weights in the base model's names (version 0, with B = 0, the base model)."""
    from tokenpo.models.loading import load_model

    port = free_port()
    server, record = standin(tmp_path, port, "server")
    try:
        done = train(tmp_path / "run", port, "algorithm=dapo", "algorithm.dynamic_sampling.oversample=1",
                     "model.lora.rank=4", "rollout.async.max_staleness=1")
    finally:
        process.stop(server)
    assert done.returncode == 0, done.stderr[-3000:]
    pushes = json.loads(record.read_text())["pushes"]
    assert [push["version"] for push in pushes] == [str(v) for v in range(STEPS + 1)]
    cfg = train_config(*SMALL)
    assert_same(pushes[0]["sums"], sums(load_model(cfg.model, cfg.seed)[1]))
    assert pushes[-1]["sums"] != pushes[0]["sums"]
    metrics = by_step(read_metrics(tmp_path / "run"))
    assert max(step["dynamic_sampling/rounds"] for step in metrics.values()) > 1

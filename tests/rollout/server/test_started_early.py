"""The server tokenpo starts is started before the policy's model loads (it boots meanwhile) from the model's
config and tokenizer alone, and stopped when the run fails before the engine takes it. The stand-in server
(standin_vllm.py) takes the place of vLLM's: the folder it is given must hold what vLLM reads."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import pytest

from support.config import SMALL
from support.runs import in_process_training, train_run
from tokenpo.deepspeed.dist import free_port
from tokenpo.rollout.generator import GeneratorDown
from tokenpo.rollout.server import engine as server_engine
from tokenpo.rollout.server import process
from tokenpo.trainer.core.policy import Policy

pytestmark = pytest.mark.e2e

HERE = Path(__file__).resolve().parent


@pytest.fixture
def standin_started(tmp_path, monkeypatch) -> Path:
    """The server tokenpo starts is the stand-in; the path of what it records."""
    record = tmp_path / "server.json"

    def spec(cfg, folder, dtype, backend, log_dir):
        command = (sys.executable, str(HERE / "standin_vllm.py"), "--port", str(cfg.server.port), "--model", folder,
                   "--record", str(record))
        return process.ServerSpec("stand-in vLLM", command, "127.0.0.1", cfg.server.port, log_dir / "server.log",
                                  {"PYTHONPATH": str(HERE.parents[2])})

    monkeypatch.setattr(server_engine, "server_spec", spec)
    return record


def overrides(port: int) -> list[str]:
    return [*SMALL, "rollout=vllm_server", f"rollout.server.port={port}", f"rollout.server.transfer_port={free_port()}",
            "trainer.max_steps=2", "eval.max_problems=1"]


def test_the_server_starts_before_the_model_loads_and_the_run_trains_on_it(tmp_path, monkeypatch, standin_started):
    running_at_build = []
    build = Policy.build

    def recording_build(cls, *args):
        running_at_build.append([server.url for server in process.STARTED.get(os.getpid(), [])
                                 if server.process.poll() is None])
        return build(*args)

    monkeypatch.setattr(Policy, "build", classmethod(recording_build))
    port = free_port()
    with in_process_training():
        train_run(tmp_path / "run", overrides(port))
    assert running_at_build == [[f"http://127.0.0.1:{port}"]]
    assert standin_started.is_file()  # it took the pushes and sampled the run
    assert not any(server.process.poll() is None for server in process.STARTED.get(os.getpid(), []))


def test_a_run_that_fails_while_the_model_loads_stops_the_server_it_started(tmp_path, monkeypatch, standin_started):
    def failing_build(cls, *args):
        raise RuntimeError("the model does not load")

    monkeypatch.setattr(Policy, "build", classmethod(failing_build))
    port = free_port()
    with in_process_training(), pytest.raises(RuntimeError, match="the model does not load"):
        train_run(tmp_path / "run", overrides(port))
    started = [server for server in process.STARTED.get(os.getpid(), []) if server.spec.port == port]
    assert len(started) == 1 and started[0].stopped and started[0].process.poll() is not None


def test_a_taken_port_stops_the_run_before_the_model_loads(tmp_path, monkeypatch, standin_started):
    built = []
    monkeypatch.setattr(Policy, "build", classmethod(lambda cls, *args: built.append(args)))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with in_process_training(), pytest.raises(GeneratorDown, match=f"port {port}.*taken|taken.*{port}"):
            train_run(tmp_path / "run", overrides(port))
    assert built == []

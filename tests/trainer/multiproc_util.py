"""Shared by the multi-process tests and the scripts their ranks run: small configs, launching ranks, reading runs."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import deepspeed.comm
import torch.distributed
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from tokenpo import CONF_DIR
from tokenpo.config import build_config
from tokenpo.data import Example
from tokenpo.deepspeed.dist import free_port
from tokenpo.trainer.launch import supervise, worker_env
from tokenpo.trainer.rollouts import StepRollouts

REPO = Path(__file__).resolve().parents[2]
# the rank scripts and the test reward function are imported from here in every process
TEST_DIRS = [REPO / "tests" / "trainer", REPO / "tests" / "deepspeed"]
# a tiny model, a tiny batch, one intra-op thread per process (two ranks share two cores), no W&B
SMALL = ["model=tiny", "logger.mode=disabled", "data.prompts_per_step=4", "rollout.group_size=2",
         "rollout.max_new_tokens=8", "eval.max_problems=4", "trainer.threads=1", "trainer.print_samples=0",
         "reward.fn=trainer_rewards:even_length", "reward.num_workers=1"]
# metrics that depend on the clock, never equal between runs
CLOCK_PREFIXES = ("timing/", "throughput/", "time/")


RANK_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def pythonpath() -> str:
    return os.pathsep.join(map(str, [*TEST_DIRS, os.environ.get("PYTHONPATH", "")]))


def cli_env(**extra: str) -> dict[str, str]:
    """Environment for a command-line run: the test dirs importable, no rank variables from this process."""
    env = {k: v for k, v in os.environ.items() if k not in RANK_VARS}
    return dict(env, PYTHONPATH=pythonpath(), **extra)


def run_ranks(script: Path, args: list[str], nproc: int, log_dir: Path, timeout_s: float = 240) -> None:
    """Run `python script *args` as ranks 0..nproc-1 of one process group; fail with the logs' tails if any fails."""
    log_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    logs = [open(log_dir / f"rank{rank}.log", "w") for rank in range(nproc)]
    procs = [subprocess.Popen([sys.executable, str(script), *args], stdout=log, stderr=subprocess.STDOUT,
                              env=dict(worker_env(rank, nproc, port), PYTHONPATH=pythonpath()))
             for rank, log in enumerate(logs)]
    timer = threading.Timer(timeout_s, lambda: [p.kill() for p in procs if p.poll() is None])
    timer.start()
    try:
        status, _ = supervise(procs, grace_s=5)
    finally:
        timer.cancel()
        for log in logs:
            log.close()
    if status:
        tails = "\n".join(f"--- rank {r} ---\n" + (log_dir / f"rank{r}.log").read_text()[-3000:] for r in range(nproc))
        raise AssertionError(f"{script.name} failed with status {status}\n{tails}")


def wait_for_step(metrics: Path, step: int, proc: subprocess.Popen, timeout: float = 150) -> None:
    """Until the run writing `metrics` has logged `step`; fails with the run's stderr if it exits first."""
    deadline = time.monotonic() + timeout
    while not (metrics.is_file() and any(json.loads(line)["step"] >= step
                                         for line in metrics.read_text().splitlines() if line.endswith("}"))):
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "no training step logged in time"
        time.sleep(0.05)


def fixed_rollouts(vocab_size: int, verdicts: list[list], max_new: int, seed: int) -> StepRollouts:
    """A step's batch that depends on nothing but `seed`: one group per row of `verdicts` (its responses' verdicts),
    random prompts and responses of varied lengths (1 to `max_new` tokens)."""
    gen = torch.Generator().manual_seed(seed)

    def tokens(low: int, high: int) -> list[int]:
        length = int(torch.randint(low, high + 1, (1,), generator=gen))
        return torch.randint(10, vocab_size, (length,), generator=gen).tolist()

    groups = len(verdicts)
    prompts = [tokens(3, 7) for _ in range(groups)]
    responses = [tokens(1, max_new) for _ in range(groups * len(verdicts[0]))]
    return StepRollouts(
        examples=[Example(uid=f"fixed-{i}", problem=f"problem {i}", answer=str(i)) for i in range(groups)],
        prompt_ids=prompts, response_ids=responses, response_text=[""] * len(responses),
        truncated=[len(r) == max_new for r in responses], verdicts=[v for group in verdicts for v in group],
        rounds=1, generated_groups=groups, mixed_groups=groups)


def compose_config(overrides: list[str]):
    """(TrainConfig, resolved dict) for `python -m tokenpo.train <overrides>`."""
    with initialize_config_dir(CONF_DIR, version_base="1.3"):
        tree = compose("train", overrides=overrides)
    return build_config(tree), OmegaConf.to_container(tree, resolve=True)


def train_run(run_dir: Path, overrides: list[str]) -> dict:
    """train() in this process (every rank calls it) into `run_dir`."""
    from tokenpo.trainer.identity import RunIdentity
    from tokenpo.trainer.loop import train

    cfg, resolved = compose_config(overrides)
    run_dir.mkdir(parents=True, exist_ok=True)
    return train(cfg, RunIdentity(run_dir, run_dir.name, "tests", resolved))


def read_metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def by_step(records: list[dict]) -> dict[int, dict]:
    steps = [r["step"] for r in records]
    assert len(steps) == len(set(steps)), f"a step was logged twice: {steps}"
    return {r["step"]: r for r in records}


def deterministic(record: dict) -> dict:
    """A metrics record without its clock-dependent entries."""
    return {k: v for k, v in record.items() if not k.startswith(CLOCK_PREFIXES)}


@contextlib.contextmanager
def in_process_training():
    """For train_run() in the test process: afterwards leave its process group of one, the RANK/WORLD_SIZE
    variables and the SIGINT/SIGTERM handlers it installed."""
    saved_env, saved_signals = dict(os.environ), {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    was_initialized = torch.distributed.is_initialized()
    try:
        yield
    finally:
        if torch.distributed.is_initialized() and not was_initialized:
            # through DeepSpeed: it also drops its cached clone of the world group, which a later in-process run
            # would otherwise use after this group is gone ('Group ... is not registered')
            deepspeed.comm.destroy_process_group()
        os.environ.clear()
        os.environ.update(saved_env)
        for sig, handler in saved_signals.items():
            signal.signal(sig, handler)

"""Training runs for the multi-process tests and the scripts their ranks run: launching ranks, a fixed batch,
train() in this process."""

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

from support.config import compose_config
from support.env import pythonpath
from tokenpo.data import Example
from tokenpo.deepspeed.dist import free_port
from tokenpo.trainer.processes.launch import supervise, worker_env
from tokenpo.trainer.core.rollouts import StepRollouts


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
    """A step's rollouts that depend on nothing but `seed` (tokenpo.trainer.core.rollouts.rollout_batch makes the batch of
    them): one group per row of `verdicts` (its responses' verdicts), random prompts and responses of varied lengths
    (1 to `max_new` tokens)."""
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
        truncated=[len(r) == max_new for r in responses], verdicts=[v for group in verdicts for v in group])


def skewed_rollouts(vocab_size: int, verdicts: list[list], max_new: int, seed: int) -> StepRollouts:
    """fixed_rollouts with lengths as at paper scale: one response in four at `max_new` tokens, the others 1 to 3,
    so the longest is >= 10x the median at max_new >= 30 (the sampler's sampled log-probs included, for TIS)."""
    rollouts = fixed_rollouts(vocab_size, verdicts, max_new, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    for i, response in enumerate(rollouts.response_ids):
        length = max_new if i % 4 == 1 else int(torch.randint(1, 4, (1,), generator=gen))
        rollouts.response_ids[i] = (response * max_new)[:length]
        rollouts.truncated[i] = length == max_new
    rollouts.sampler_logprobs = [(-torch.rand(len(r), generator=gen)).tolist() for r in rollouts.response_ids]
    return rollouts


def train_run(run_dir: Path, overrides: list[str]) -> dict:
    """train() in this process (every rank calls it) into `run_dir`."""
    from tokenpo.trainer.harness.identity import RunIdentity
    from tokenpo.trainer.harness.loop import train

    cfg, resolved = compose_config(overrides)
    run_dir.mkdir(parents=True, exist_ok=True)
    return train(cfg, RunIdentity(run_dir, run_dir.name, "tests", resolved))


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

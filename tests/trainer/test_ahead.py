"""Generation ahead of the update (rollout.async.max_staleness, tokenpo.trainer.core.source.Schedule): each step's batch is sampled
by the policy version the staleness bound names, exactly; the behaviour log-probs come from the generator process;
a run samples the same every time and resumes exactly with rounds in flight; k = 0 takes the synchronous path."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from support.config import ALGORITHM_NAMES, SMALL
from support.env import cli_env
from support.metrics import by_step, deterministic, read_metrics
from support.runs import in_process_training, train_run
from tokenpo.trainer.core import step as trainer_step
from tokenpo.errors import ConfigError
from tokenpo.rollout.ahead import generator_device
from tokenpo.rollout.generator import version_for

pytestmark = pytest.mark.e2e

STEPS = 4
# the tiny model's rewards are all 0: an entropy bonus moves the weights, so a stale batch's log-probs differ
MOVING = SMALL + [f"trainer.max_steps={STEPS}", "algorithm.loss.entropy_coef=0.05", "trainer.lr=1e-2",
                  "trainer.warmup_steps=0", "eval.max_problems=1", "eval.before_training=false",
                  "rollout.async.generator_threads=1"]


def run(tmp_path, name: str, *overrides: str) -> dict:
    with in_process_training():
        train_run(tmp_path / name, [*MOVING, *overrides])
    return by_step(read_metrics(tmp_path / name))


def test_the_version_rule():
    assert [version_for(step, 1) for step in range(1, 6)] == [0, 0, 1, 2, 3]
    assert [version_for(step, 2) for step in range(1, 6)] == [0, 0, 0, 1, 2]


def test_a_cuda_generator_device_is_refused_when_several_processes_would_share_it():
    assert generator_device("cuda:1", 1) == "cuda:1" and generator_device("cpu", 4) == "cpu"
    with pytest.raises(ConfigError, match=r"^rollout.async.generator_device=cuda:1: each of the 2 processes "):
        generator_device("cuda:1", 2)


@pytest.mark.parametrize("k", [1, 2])
def test_each_batch_is_as_stale_as_the_bound_says_and_carries_the_samplers_log_probs(tmp_path, k):
    metrics = run(tmp_path, "ahead", f"rollout.async.max_staleness={k}")
    for step in range(1, STEPS + 1):
        lag = min(k, step - 1)
        assert metrics[step]["async/staleness"] == lag and metrics[step][f"async/staleness_frac_{lag}"] == 1.0
        # the generator's log-probs of its tokens against the trainer's at the start of the update: equal while the
        # batch is on-policy, apart once the weights it was sampled with are `lag` updates old
        kl = metrics[step]["mismatch/kl"]
        assert (kl < 1e-6) if lag == 0 else (kl > 1e-4), (step, kl)
    assert metrics[1]["timing/trainer_wait_rollouts_s"] > 0  # the generator process starts with the run


def test_an_ahead_run_samples_the_same_every_time(tmp_path):
    first, second = (run(tmp_path, name, "rollout.async.max_staleness=1") for name in ("a", "b"))
    for step in range(1, STEPS + 1):
        assert deterministic(first[step]) == deterministic(second[step]), step


def test_a_run_stopped_with_rounds_in_flight_resumes_to_the_uninterrupted_metrics(tmp_path, monkeypatch):
    ahead = ["rollout.async.max_staleness=2", "trainer.save_every=1"]
    whole = run(tmp_path, "whole", *ahead)
    step_fn = trainer_step.train_step

    def stop_after_step_2(step, *args, **kwargs):
        result = step_fn(step, *args, **kwargs)
        if step == 2:  # rounds 3 and 4 are in flight now: the loop saves and stops
            os.kill(os.getpid(), signal.SIGTERM)
        return result

    monkeypatch.setattr("tokenpo.trainer.harness.loop.train_step", stop_after_step_2)
    stopped = run(tmp_path, "resumed", *ahead)
    assert sorted(stopped) == [1, 2]
    monkeypatch.setattr("tokenpo.trainer.harness.loop.train_step", step_fn)
    resumed = run(tmp_path, "resumed", *ahead)
    assert sorted(resumed) == [1, 2, 3, 4]
    for step in range(1, STEPS + 1):
        assert deterministic(resumed[step]) == deterministic(whole[step]), step
    assert resumed[3]["async/staleness"] == 2


def test_a_finished_ahead_run_resumed_for_more_steps_samples_them_with_the_weights_it_has(tmp_path):
    """Resumed from its last checkpoint with trainer.max_steps raised, a k = 1 run has nothing in flight, and the
    version the schedule names for step 3's first round (1) is gone: the round is sampled by version 2, the one the
    run holds; step 4's is as stale as the bound allows again."""
    ahead = ["rollout.async.max_staleness=1", "trainer.save_every=1"]
    first = run(tmp_path, "more", *ahead, "trainer.max_steps=2")
    assert sorted(first) == [1, 2]
    resumed = run(tmp_path, "more", *ahead, "trainer.max_steps=4")
    assert sorted(resumed) == [1, 2, 3, 4]
    assert [resumed[step]["async/staleness"] for step in (3, 4)] == [0.0, 1.0]


def test_generating_in_turn_keeps_the_synchronous_path(tmp_path):
    metrics = run(tmp_path, "in_turn", "rollout.async.max_staleness=0")
    assert not [key for key in metrics[1] if key.startswith("async/")]
    assert "mismatch/kl" not in metrics[1]  # the hf engine returns no log-probs in turn


@pytest.mark.parametrize("algorithm", ALGORITHM_NAMES)
def test_every_algorithm_trains_ahead_with_the_decoupled_correction(tmp_path, algorithm):
    """k = 2 with AReaL's masked behaviour weight (tis_cap 5, mask): batches 0, 1 and 2 versions old, so every
    staleness k = 1 or 2 can give the update (which depends on a batch's staleness, not on k); DAPO's dynamic
    sampling fills its short rounds (the tiny model's rewards are all equal) from the further rounds it asks for."""
    metrics = run(tmp_path, algorithm, f"algorithm={algorithm}", "trainer.max_steps=3", "rollout.async.max_staleness=2",
                  "algorithm.loss.tis_cap=5", "algorithm.loss.tis_mode=mask",
                  "algorithm.dynamic_sampling.on_exhausted=fill")
    assert [metrics[step]["async/staleness"] for step in (1, 2, 3)] == [0.0, 1.0, 2.0]
    assert "tis/raw_weight_max" in metrics[3] and metrics[3]["tis/weight_mean"] > 0


def test_lora_trains_ahead(tmp_path):
    metrics = run(tmp_path, "lora", "model.lora.rank=4", "rollout.async.max_staleness=1")
    assert metrics[STEPS]["async/staleness"] == 1.0 and metrics[STEPS]["mismatch/kl"] > 0


@pytest.mark.multiproc
def test_two_processes_under_zero3_generate_ahead_and_resume_from_a_checkpoint_with_rounds_in_flight(tmp_path):
    """trainer.nproc=2: a generator per process; process 1's rounds in flight at step 2 are its own, saved in the
    checkpoint beside process 0's, and a run resumed from that checkpoint into a new run dir logs the step 3 of the
    uninterrupted run."""
    common = [*MOVING, "trainer.max_steps=3", "trainer.nproc=2", "deepspeed=zero3", "rollout.async.max_staleness=1",
              "trainer.save_every=1"]

    def cli(run_dir, *extra):
        done = subprocess.run([sys.executable, "-m", "tokenpo.train", *common, *extra, f"hydra.run.dir={run_dir}"],
                              cwd=tmp_path, env=cli_env(), capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        return by_step(read_metrics(run_dir))

    whole = cli(tmp_path / "whole")
    resumed = cli(tmp_path / "resumed", f"trainer.resume={tmp_path / 'whole' / 'checkpoints' / 'step_000002'}")
    assert sorted(resumed) == [3] and resumed[3]["async/staleness"] == 1.0
    assert deterministic(resumed[3]) == deterministic(whole[3])


def test_without_the_decoupled_objective_the_samplers_log_probs_are_the_old_policys(tmp_path):
    """rollout.async.decoupled=false, AReaL's control: no proximal pass, ratios against the stale sampler."""
    decoupled = run(tmp_path, "decoupled", "rollout.async.max_staleness=1")
    plain = run(tmp_path, "plain", "rollout.async.max_staleness=1", "rollout.async.decoupled=false")
    # one update per step: the proximal policy is the one being updated (ratio 1, its own forward's log-probs: no
    # pass of its own), the sampler is one update behind
    assert decoupled[3]["kl/old"] < 1e-9 and plain[3]["kl/old"] > 1e-4
    assert "timing/old_logprob_s" not in decoupled[3] and "timing/old_logprob_s" not in plain[3]
    assert decoupled[3]["mismatch/kl"] > 1e-4  # the behaviour weight compares the sampler with the proximal policy
    # without it the sampler is the old policy: no sampler/trainer KL to log (it would be 0 by construction)
    assert "mismatch/kl" not in plain[3] and "tis/weight_mean" not in plain[3]



def running(process: psutil.Process) -> bool:
    """Not exited (a zombie counts as exited: its new parent may be slow to reap it, or never reap it in a container)."""
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def command(process: psutil.Process) -> str:
    try:
        return " ".join(process.cmdline())
    except psutil.Error:  # exited meanwhile
        return ""


def logged_a_step(run_dir) -> bool:
    metrics = run_dir / "metrics.jsonl"
    return metrics.exists() and metrics.stat().st_size > 0


def test_no_process_outlives_a_sigkilled_trainer(tmp_path):
    """The generator process, and multiprocessing's resource tracker that the trainer started for it, die with a
    trainer killed without a word (SIGKILL: the trainer gets no chance to stop them)."""
    run_dir = tmp_path / "run"
    trainer = subprocess.Popen(
        [sys.executable, "-m", "tokenpo.train", *SMALL, "rollout.async.max_staleness=1", "trainer.max_steps=50",
         "eval.every_steps=0", "eval.before_training=false", f"hydra.run.dir={run_dir}"],
        cwd=tmp_path, env=cli_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    started = []
    try:
        deadline = time.monotonic() + 45
        # a step logged: the generator process has served a request and waits for the next
        while not logged_a_step(run_dir):
            assert trainer.poll() is None and time.monotonic() < deadline, "the run did not log a step"
            time.sleep(0.1)
        started = [process for process in psutil.Process(trainer.pid).children(recursive=True) if running(process)]
        commands = " ".join(map(command, started))
    finally:
        trainer.kill()
        trainer.wait()
    deadline = time.monotonic() + 5
    while any(map(running, started)) and time.monotonic() < deadline:
        time.sleep(0.05)
    alive = [command(process)[:100] for process in started if running(process)]
    for process in started:  # not left behind by the test
        if running(process):
            process.kill()
    # spawned: the reward worker and the generator; the resource tracker, started by the spawn context for the
    # queues' semaphores, exits once no process holds its pipe, the generator included
    assert commands.count("--multiprocessing-fork") == 2 and "resource_tracker" in commands, commands
    assert alive == []

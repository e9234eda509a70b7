"""Generation ahead of the update (rollout.async.max_staleness, tokenpo.trainer.ahead): each step's batch is sampled
by the policy version the staleness bound names, exactly; the behaviour log-probs come from the generator process;
a run samples the same every time and resumes exactly with rounds in flight; k = 0 takes the synchronous path."""

from __future__ import annotations

import os
import signal

import pytest

from support.config import SMALL
from support.metrics import by_step, deterministic, read_metrics
from support.runs import in_process_training, train_run
from tokenpo.trainer import step as trainer_step
from tokenpo.trainer.ahead import version_for

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

    monkeypatch.setattr("tokenpo.trainer.loop.train_step", stop_after_step_2)
    stopped = run(tmp_path, "resumed", *ahead)
    assert sorted(stopped) == [1, 2]
    monkeypatch.setattr("tokenpo.trainer.loop.train_step", step_fn)
    resumed = run(tmp_path, "resumed", *ahead)
    assert sorted(resumed) == [1, 2, 3, 4]
    for step in range(1, STEPS + 1):
        assert deterministic(resumed[step]) == deterministic(whole[step]), step
    assert resumed[3]["async/staleness"] == 2


def test_generating_in_turn_keeps_the_synchronous_path(tmp_path):
    metrics = run(tmp_path, "in_turn", "rollout.async.max_staleness=0")
    assert not [key for key in metrics[1] if key.startswith("async/")]
    assert "mismatch/kl" not in metrics[1]  # the hf engine returns no log-probs in turn

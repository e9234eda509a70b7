"""Runs that watch themselves (trainer.health, tokenpo.trainer.harness.health): each detector's logic on hand-built metric
sequences; the update guard on a plain optimizer; tiny runs of the real trainer built to trip each detector (a
non-finite loss never reaches the weights, under ZeRO 0-3); the stop and the resume that carries the detectors'
state; and the committed metrics of the main job replayed through the default config, on which none fires."""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path

import pytest
import torch

from support.config import SMALL, train_config
from support.env import REPO
from support.metrics import by_step, read_metrics
from support.runs import in_process_training, train_run
from tokenpo import algorithms as alg
from tokenpo.errors import ConfigError
from tokenpo.rollout.engine import ENGINES
from tokenpo.rollout.hf import HFEngine
from tokenpo.trainer.harness import health
from tokenpo.trainer.core import step as step_module
from tokenpo.trainer.config import HealthConfig
from tokenpo.trainer.core.source import RolloutSource
from tokenpo.trainer.config import DETECTORS
from tokenpo.trainer.harness.health import Bound, ConstantReward, Detectors, Entropy, HealthStop, config_with, replay
from tokenpo.trainer.core.update_guard import UpdateGuard

MAIN_JOB = REPO / "docs" / "data" / "main_job" / "metrics.jsonl"


def fired(detector, values: list, key: str) -> list[bool]:
    """Whether `detector` fires at each step of `values` (None: the step lacks the metric)."""
    out = []
    for value in values:
        seen = detector.observe({} if value is None else {key: value})
        out.append(bool(seen and seen[0]))
    return out


# --- each detector's logic ---

def test_constant_reward_fires_at_the_nth_step_in_a_row_and_resets():
    detector = ConstantReward(steps=3)
    values = [0.0, 0.0, 0.5, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.25]
    assert fired(detector, values, "reward/correct_frac") == [
        False, False, False,  # a mixed step resets the count
        False, False, True, True,  # the 3rd all-wrong step in a row fires, and the 4th
        False, False, True,  # all right after all wrong counts afresh
        False]


def test_constant_reward_off_or_without_its_metric_counts_nothing():
    assert fired(ConstantReward(steps=None), [0.0] * 5, "reward/correct_frac") == [False] * 5
    detector = ConstantReward(steps=2)
    # a step without the metric (no update that step) neither counts nor resets
    assert fired(detector, [0.0, None, 0.0], "reward/correct_frac") == [False, False, True]
    assert fired(ConstantReward(steps=1), [0.0], "reward/correct_frac") == [True]


def test_a_bound_fires_above_it_for_its_steps_in_a_row():
    detector = Bound("ratio", "kl/old", 0.1, steps=2, off_key="max_kl_old")
    assert fired(detector, [0.2, 0.05, 0.2, 0.3, 0.4, 0.1, 0.11], "kl/old") == [
        False, False, False, True, True, False, False]  # the bound itself does not fire
    assert fired(Bound("ratio", "kl/old", None, 1, "max_kl_old"), [9.0], "kl/old") == [False]  # off
    # without the engine's log-probs there is no mismatch metric: the sampler/trainer detector stays quiet
    sampler = Bound("sampler_kl", "mismatch/kl", 0.0, 1, "max_kl")
    assert [sampler.observe({"kl/old": 5.0, "entropy/mean": 1.0}) for _ in range(3)] == [None] * 3


def test_entropy_measures_against_the_mean_of_the_first_steps():
    detector = Entropy(reference_steps=2, collapse_frac=0.5, blowup_factor=2.0, steps=2)
    # the reference is (2.0 + 2.2) / 2 = 2.1: collapse below 1.05, blow-up above 4.2
    values = [2.0, 2.2, 1.0, 1.0, 1.2, 4.3, 4.3, 4.2, 0.01]
    assert fired(detector, values, "entropy/mean") == [
        False, False,  # the reference's steps are never checked
        False, True,  # the 2nd step in a row below half the start
        False,  # 1.2 is above the bound: reset
        False, True,  # above twice the start, twice
        False, False]
    assert detector.reference == pytest.approx(2.1)
    early = Entropy(reference_steps=3, collapse_frac=0.5, blowup_factor=None, steps=1)
    assert fired(early, [2.0, 0.1, 2.0, 0.1], "entropy/mean") == [False, False, False, True]
    assert early.reference == pytest.approx(4.1 / 3)
    assert fired(Entropy(1, None, None, 1), [2.0, 0.0, 9.0], "entropy/mean") == [False] * 3  # both bounds off


def test_the_defaults_allow_a_40x_entropy_fall_but_not_a_100x_one():
    detector = Detectors(HealthConfig())
    steps = [2.1, 2.1, 2.1] + [2.1 / 40] * 5 + [2.1 / 101] * 3
    entropy = [any(f.detector == "entropy" for f in detector.observe({"entropy/mean": v})) for v in steps]
    assert entropy == [False] * 8 + [False, False, True]  # three steps in a row below 1 % of the start


def test_nonfinite_fires_on_a_null_loss_in_a_replay_and_on_each_guarded_update():
    detectors = Detectors(HealthConfig())
    assert detectors.observe({"loss": 0.1, "grad_norm": 1.0}) == []
    (firing,) = detectors.observe({"loss": None, "grad_norm": 1.0})  # metrics.jsonl stores NaN as null
    assert (firing.detector, firing.action, firing.reason) == ("nonfinite", "skip", "loss not finite")
    (firing,) = detectors.observe({"loss": 0.1, "grad_norm": float("inf")}, ["nonfinite"], nonfinite=1)
    assert firing.reason.startswith("1 update(s) with a non-finite loss or gradient, not applied")


def test_health_metrics_name_every_detector_and_the_skipped_count():
    detectors = Detectors(HealthConfig(), {"skipped_updates": 3})
    firings = detectors.observe({"loss": None})
    assert detectors.metrics(firings) == {"health/constant_reward_fired": 0.0, "health/nonfinite_fired": 1.0,
                                          "health/ratio_fired": 0.0, "health/sampler_kl_fired": 0.0,
                                          "health/entropy_fired": 0.0, "health/reward_errors_fired": 0.0,
                                          "health/skipped_updates": 3.0}


def test_a_streak_logs_at_its_first_step_only():
    cfg = config_with(["constant_reward.steps=2"])
    detectors = Detectors(cfg)
    firsts = [[f.first for f in detectors.observe({"reward/correct_frac": 0.0})] for _ in range(4)]
    assert firsts == [[], [True], [False], [False]]


def test_the_state_carries_every_count_and_the_entropy_reference():
    cfg = config_with(["constant_reward.steps=3", "entropy.reference_steps=2", "entropy.collapse_frac=0.5",
                       "entropy.steps=1", "ratio.steps=2"])
    rows = [{"reward/correct_frac": 0.0, "entropy/mean": 2.0, "kl/old": 0.5},
            {"reward/correct_frac": 0.0, "entropy/mean": 2.2, "kl/old": 0.0},
            {"reward/correct_frac": 0.0, "entropy/mean": 1.0, "kl/old": 0.5},
            {"reward/correct_frac": 0.0, "entropy/mean": 0.5, "kl/old": 0.5}]
    whole = Detectors(cfg)
    expected = [[f.detector for f in whole.observe(row)] for row in rows]
    assert expected == [[], [], ["constant_reward", "entropy"], ["constant_reward", "ratio", "entropy"]]
    first = Detectors(cfg)
    for row in rows[:2]:
        first.observe(row)
    saved = json.loads(json.dumps(first.state_dict()))  # checkpoints keep plain values
    resumed = Detectors(cfg, saved)
    assert [[f.detector for f in resumed.observe(row)] for row in rows[2:]] == expected[2:]
    assert [[f.detector for f in Detectors(cfg).observe(row)] for row in rows[2:]] != expected[2:]  # without it


# --- config ---

def test_the_config_refuses_a_warn_for_nonfinite_and_bounds_out_of_range():
    with pytest.raises(ConfigError, match=r"trainer.health.nonfinite.action must be one of skip, stop, got 'warn'"):
        train_config("trainer.health.nonfinite.action=warn")
    with pytest.raises(ConfigError, match=r"trainer.health.entropy.collapse_frac must be in \(0, 1\) or null"):
        train_config("trainer.health.entropy.collapse_frac=1.5")
    with pytest.raises(ConfigError, match=r"trainer.health.ratio.action must be one of warn, skip, stop"):
        train_config("trainer.health.ratio.action=halt")
    cfg = train_config("trainer.health.entropy.collapse_frac=null", "trainer.health.constant_reward.steps=null")
    assert (cfg.trainer.health.entropy.collapse_frac, cfg.trainer.health.constant_reward.steps) == (None, None)
    assert train_config().trainer.health == HealthConfig()  # the shipped file is the dataclass's defaults


# --- the embedded default: replayed, nothing fires ---

def main_job_rows() -> list[dict]:
    return [json.loads(line) for line in MAIN_JOB.read_text().splitlines() if line.strip()]


def test_no_detector_fires_on_the_main_jobs_metrics_with_the_defaults():
    rows = main_job_rows()
    assert [row["step"] for row in rows] == list(range(31))  # the before-training row and 30 steps
    assert replay(rows) == []
    # what the defaults have to allow there: entropy falls to 2.3 % of its start at its lowest step, and one step
    # pays every response (reward/correct_frac 1 at step 26)
    start = sum(row["entropy/mean"] for row in rows[1:4]) / 3
    assert min(row["entropy/mean"] for row in rows[1:]) / start == pytest.approx(0.0226, abs=5e-4)
    assert [row["step"] for row in rows[1:] if row["reward/correct_frac"] in (0.0, 1.0)] == [26]


def test_the_replay_fires_where_a_tighter_config_says():
    rows = main_job_rows()
    tight = config_with(["entropy.collapse_frac=0.05", "entropy.steps=1", "constant_reward.steps=1"])
    assert [(step, firing.detector) for step, firing in replay(rows, tight)] == [
        (25, "entropy"), (26, "constant_reward"), (26, "entropy"), (28, "entropy")]


def test_the_replay_command_prints_each_firing(capsys):
    assert health.main([str(MAIN_JOB)]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"{MAIN_JOB}: 0 firing(s) in 30 training steps; constant_reward 0, nonfinite 0, ratio 0, sampler_kl 0, "
        "entropy 0, reward_errors 0"]
    assert health.main([str(MAIN_JOB), "trainer.health.constant_reward.steps=1"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0] == ("step 26: constant_reward fires (action warn): every response judged right "
                      "(reward/correct_frac 1) for 1 steps in a row")
    assert health.main([str(MAIN_JOB), "entropy.collapse_frac=2"]) == 2


# --- the update guard on a plain optimizer ---

class StepEngine:
    """What the guard needs of a DeepSpeed engine: step() runs the optimizer's step, then zeroes the gradients."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer

    def step(self) -> None:
        self.optimizer.step()
        self.optimizer.zero_grad()


def guarded() -> tuple[torch.nn.Linear, UpdateGuard, StepEngine]:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    return model, UpdateGuard(optimizer), StepEngine(optimizer)


def backward(model: torch.nn.Linear, guard: UpdateGuard, scale: float = 1.0) -> None:
    loss = model(torch.ones(1, 3)).sum() * scale
    guard.note_loss(loss)
    loss.backward()


def weights(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b))


def test_the_guard_never_applies_a_nonfinite_loss_or_gradient():
    model, guard, engine = guarded()
    before = weights(model)
    backward(model, guard, float("nan"))  # NaN loss, NaN gradients
    guard.step(engine)
    assert same(weights(model), before) and all(p.grad is None for p in model.parameters())
    model.weight.register_hook(lambda g: torch.full_like(g, float("inf")))  # a finite loss, an infinite gradient
    backward(model, guard)
    guard.step(engine)
    assert same(weights(model), before)
    assert guard.take() == (2, 2)
    model.weight._backward_hooks.clear()
    backward(model, guard)
    guard.step(engine)
    assert not same(weights(model), before) and guard.take() == (0, 0)


def test_a_nonfinite_loss_with_finite_gradients_is_not_applied_either():
    model, guard, engine = guarded()
    before = weights(model)
    loss = model(torch.ones(1, 3)).sum()
    guard.note_loss(loss + float("nan"))  # the loss reported is NaN, its gradient path is not
    loss.backward()
    guard.step(engine)
    assert same(weights(model), before) and guard.take() == (1, 1)


def test_a_held_update_waits_for_release_and_a_veto_skips_it():
    model, guard, engine = guarded()
    guard.hold = True
    before = weights(model)
    backward(model, guard)
    guard.step(engine)
    assert same(weights(model), before)  # held
    assert guard.release(veto=True) and same(weights(model), before) and guard.take() == (1, 0)
    assert all(p.grad is None for p in model.parameters())  # skipped: the gradients are gone all the same
    backward(model, guard)
    guard.step(engine)
    guard.flush()  # a pass about to read the weights applies it
    after = weights(model)
    assert not same(after, before) and not guard.release(veto=True) and guard.take() == (0, 0)


# --- tiny runs of the real trainer ---

def run_metrics(run_dir: Path) -> dict[int, dict]:
    return {step: row for step, row in by_step(read_metrics(run_dir)).items() if step > 0}


def column(rows: dict[int, dict], key: str) -> list:
    return [rows[step][key] for step in sorted(rows)]


TINY = [*SMALL, "trainer.max_steps=3", "eval.before_training=false", "eval.every_steps=0"]
# every response of the random tiny model is wrong without the test reward: every reward 0
ALL_WRONG = [override for override in TINY if not override.startswith("reward.fn=")]


@pytest.fixture
def weights_after_each_step(monkeypatch) -> list[list[torch.Tensor]]:
    """The policy's parameters before step 1, then after each step (when the step publishes its version)."""
    recorded: list[list[torch.Tensor]] = []

    def parameters(policy) -> list[torch.Tensor]:
        # ZeRO-3 on one process: each parameter's whole partition is its ds_tensor
        return [(p.ds_tensor if hasattr(p, "ds_tensor") else p).detach().clone() for p in policy.module.parameters()]

    update_policy, after_update = step_module.update_policy, RolloutSource.after_update

    def recording_update(run, policy, *args, **kwargs):
        if not recorded:
            recorded.append(parameters(policy))
        return update_policy(run, policy, *args, **kwargs)

    def recording_after_update(source, step, policy):
        recorded.append(parameters(policy))
        return after_update(source, step, policy)

    monkeypatch.setattr(step_module, "update_policy", recording_update)
    monkeypatch.setattr(RolloutSource, "after_update", recording_after_update)
    return recorded


def test_every_reward_zero_fires_at_the_nth_step_of_a_tiny_run(tmp_path, caplog):
    with in_process_training(), caplog.at_level(logging.WARNING, logger="tokenpo"):
        train_run(tmp_path / "run", [*ALL_WRONG, "trainer.health.constant_reward.steps=2"])
    rows = run_metrics(tmp_path / "run")
    assert column(rows, "reward/correct_frac") == [0.0, 0.0, 0.0]
    assert column(rows, "health/constant_reward_fired") == [0.0, 1.0, 1.0]
    assert column(rows, "health/skipped_updates") == [0.0, 0.0, 0.0]  # warn: the updates are applied
    for name in DETECTORS:
        if name != "constant_reward":
            assert column(rows, f"health/{name}_fired") == [0.0, 0.0, 0.0]
    warnings = [r.getMessage() for r in caplog.records if r.getMessage().startswith("health:")]
    assert warnings == ["health: constant_reward at step 2: every response judged wrong (reward/correct_frac 0) for "
                        "2 steps in a row (action warn; trainer.health.constant_reward)"]


def nan_loss_at_step(monkeypatch, nan_step: int) -> None:
    """alg.micro_batch_loss returns a NaN loss (NaN gradients) during step `nan_step`."""
    update_policy, micro_batch_loss, current = step_module.update_policy, alg.micro_batch_loss, {}

    def tracking_update(run, policy, rollouts, timings, step=0, *args, **kwargs):
        current["step"] = step
        return update_policy(run, policy, rollouts, timings, step, *args, **kwargs)

    def nan_loss(*args, **kwargs):
        loss, metrics = micro_batch_loss(*args, **kwargs)
        return (loss * float("nan") if current["step"] == nan_step else loss), metrics

    monkeypatch.setattr(step_module, "update_policy", tracking_update)
    monkeypatch.setattr(alg, "micro_batch_loss", nan_loss)


@pytest.mark.parametrize("deepspeed", ["zero0", "zero1", "zero2", "zero3", "zero0-bf16"])
def test_a_nan_loss_never_reaches_the_weights(tmp_path, monkeypatch, weights_after_each_step, deepspeed):
    nan_loss_at_step(monkeypatch, 2)
    stage, _, precision = deepspeed.partition("-")
    overrides = [f"deepspeed={stage}"] + (["deepspeed.precision=bf16", "model.dtype=bfloat16"] if precision else [])
    with in_process_training():
        train_run(tmp_path / "run", [*TINY, *overrides])
    initial, after_1, after_2, after_3 = weights_after_each_step
    assert not same(after_1, initial)  # step 1 trains
    assert same(after_2, after_1)  # step 2's NaN update is not applied
    assert not same(after_3, after_2) and all(bool(torch.isfinite(w.float()).all()) for w in after_3)
    rows = run_metrics(tmp_path / "run")
    assert column(rows, "loss")[1] is None  # NaN, stored as null
    assert column(rows, "health/nonfinite_fired") == [0.0, 1.0, 0.0]
    assert column(rows, "health/skipped_updates") == [0.0, 1.0, 1.0]


def test_a_nan_loss_with_action_stop_saves_and_ends_the_run(tmp_path, monkeypatch, weights_after_each_step):
    nan_loss_at_step(monkeypatch, 2)
    with in_process_training(), pytest.raises(HealthStop) as stopped:
        train_run(tmp_path / "run", [*TINY, "trainer.health.nonfinite.action=stop"])
    assert str(stopped.value).startswith("trainer.health.nonfinite stopped the run at step 2: 1 update(s) with a "
                                         "non-finite loss or gradient, not applied (loss, grad_norm not finite)")
    assert str(stopped.value).endswith("the same command with trainer.health.nonfinite.action=skip (skip such "
                                       "updates) resumes from it")
    assert same(weights_after_each_step[2], weights_after_each_step[1])
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").glob("step_*")) == ["step_000002"]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert (summary["steps"], summary["interrupted"], summary["signal"]) == (2, True, None)


class StaleSampler(HFEngine):
    """The hf engine returning the sampled tokens' log-probs 0.5 nats above its own: a sampler out of step with the
    trainer, as after a weight load that failed."""

    def sample(self, prompt_ids, params, rng):
        out = super().sample(prompt_ids, dataclasses.replace(params, logprobs=True), rng)
        return dataclasses.replace(out, logprobs=[[lp + 0.5 for lp in row] for row in out.logprobs])


@pytest.fixture
def stale_sampler(monkeypatch) -> str:
    monkeypatch.setitem(ENGINES._functions, "stale", StaleSampler)
    monkeypatch.setitem(ENGINES._traits, "stale", {})
    return "rollout.engine=stale"


def test_ratio_sampler_kl_and_entropy_trip_on_bounds_the_tiny_run_crosses(tmp_path, stale_sampler):
    with in_process_training():
        train_run(tmp_path / "run", [
            *TINY, stale_sampler, "trainer.mini_batches=2", "trainer.lr=1e-3",
            # the second mini-batch's ratios move off 1
            "trainer.health.ratio.max_kl_old=0.0",
            "trainer.health.sampler_kl.max_kl=0.1",
            # its entropy moves by less than 1e-3 a step: bounds 1e-6 either side of step 1's
            "trainer.health.entropy.reference_steps=1", "trainer.health.entropy.steps=1",
            "trainer.health.entropy.collapse_frac=0.999999", "trainer.health.entropy.blowup_factor=1.000001"])
    rows = run_metrics(tmp_path / "run")
    assert all(0 < value for value in column(rows, "kl/old"))
    assert column(rows, "health/ratio_fired") == [1.0, 1.0, 1.0]
    # k3 of a 0.5-nat log-ratio: e^-0.5 - 1 + 0.5 = 0.107 on every token
    assert column(rows, "mismatch/kl") == pytest.approx([0.1065] * 3, abs=1e-3)
    assert column(rows, "health/sampler_kl_fired") == [1.0, 1.0, 1.0]
    assert column(rows, "health/entropy_fired") == [0.0, 1.0, 1.0]  # step 1 is the reference
    assert column(rows, "health/skipped_updates") == [0.0, 0.0, 0.0]


def test_without_the_engines_log_probs_the_sampler_kl_detector_is_inactive(tmp_path):
    with in_process_training():
        train_run(tmp_path / "run", [*TINY, "trainer.health.sampler_kl.max_kl=0.0"])
    rows = run_metrics(tmp_path / "run")
    assert all("mismatch/kl" not in row for row in rows.values())
    assert column(rows, "health/sampler_kl_fired") == [0.0, 0.0, 0.0]


def test_skip_leaves_the_steps_update_unapplied(tmp_path, weights_after_each_step):
    with in_process_training():
        train_run(tmp_path / "run", [
            *TINY, "trainer.lr=1e-3", "trainer.health.entropy.action=skip",
            "trainer.health.entropy.reference_steps=1", "trainer.health.entropy.steps=1",
            "trainer.health.entropy.collapse_frac=0.999999", "trainer.health.entropy.blowup_factor=1.000001"])
    rows = run_metrics(tmp_path / "run")
    assert column(rows, "health/entropy_fired") == [0.0, 1.0, 1.0]
    assert column(rows, "health/skipped_updates") == [0.0, 1.0, 2.0]
    initial, after_1, after_2, after_3 = weights_after_each_step
    assert not same(after_1, initial) and same(after_2, after_1) and same(after_3, after_2)
    # the grad norm logged is that of the update the check held, not the one before
    assert len(set(column(rows, "grad_norm"))) == 3 and all(value > 0 for value in column(rows, "grad_norm"))


def test_stop_saves_a_checkpoint_and_a_resume_carries_the_detectors_state(tmp_path, caplog):
    entropy = ["trainer.health.entropy.reference_steps=2", "trainer.health.entropy.steps=1",
               "trainer.health.entropy.collapse_frac=0.999999", "trainer.health.entropy.blowup_factor=1.000001"]
    run = tmp_path / "run"
    with in_process_training(), pytest.raises(HealthStop) as stopped:
        train_run(run, [*ALL_WRONG, *entropy, "trainer.health.constant_reward.steps=2",
                        "trainer.health.constant_reward.action=stop"])
    assert str(stopped.value) == (
        "trainer.health.constant_reward stopped the run at step 2: every response judged wrong (reward/correct_frac 0) "
        f"for 2 steps in a row; checkpoint saved in {run}/checkpoints: the same command with "
        "trainer.health.constant_reward.action=warn (a warning only) or trainer.health.constant_reward.steps=null "
        "(off) resumes from it")
    assert sorted(p.name for p in (run / "checkpoints").glob("step_*")) == ["step_000002"]
    assert column(run_metrics(run), "health/skipped_updates") == [0.0, 1.0]  # stop skips the update, as skip does
    with in_process_training(), caplog.at_level(logging.WARNING, logger="tokenpo"):
        train_run(run, [*ALL_WRONG, *entropy, "trainer.health.constant_reward.steps=2"])
    rows = run_metrics(run)
    assert sorted(rows) == [1, 2, 3]
    # from the checkpoint: the all-wrong count (3 in a row at step 3), the entropy reference (steps 1-2), the
    # skipped count; a fresh state would have fired neither and counted 0
    assert column(rows, "health/constant_reward_fired") == [0.0, 1.0, 1.0]
    assert column(rows, "health/entropy_fired") == [0.0, 0.0, 1.0]
    assert column(rows, "health/skipped_updates") == [0.0, 1.0, 1.0]
    # the streak that fired before the stop does not log again after the resume
    assert not any("constant_reward at step 3" in r.getMessage() for r in caplog.records)


def test_an_alert_is_one_warning_line_and_a_wandb_alert(tmp_path, caplog):
    from tokenpo.logger.config import LoggerConfig
    from tokenpo.logger.run_logger import RunLogger
    from tokenpo.trainer.harness.identity import RunIdentity

    sent = []

    class FakeRun:
        def alert(self, **kwargs):
            sent.append(kwargs)

    logger = RunLogger(LoggerConfig(mode="disabled"), RunIdentity(tmp_path, "n", "g", {}), enabled=True)
    logger.wandb_run = FakeRun()
    with caplog.at_level(logging.WARNING, logger="tokenpo"):
        logger.alert("tokenpo health: ratio", "health: ratio at step 3: ...")
        logger.alert("tokenpo health: nonfinite", "health: nonfinite at step 4: ...", error=True)
    assert [r.getMessage() for r in caplog.records] == ["health: ratio at step 3: ...",
                                                        "health: nonfinite at step 4: ..."]
    assert [(a["title"], a["level"].value) for a in sent] == [("tokenpo health: ratio", "WARN"),
                                                              ("tokenpo health: nonfinite", "ERROR")]
    other_rank = RunLogger(LoggerConfig(mode="disabled"), RunIdentity(tmp_path, "n", "g", {}), enabled=False)
    other_rank.wandb_run = FakeRun()
    other_rank.alert("t", "x")
    assert len(sent) == 2  # rank 0 alone alerts


def test_the_run_state_carries_the_health_state_in_its_checkpoint_client_state():
    from tokenpo.trainer.harness.state import RunState

    detectors = Detectors(config_with(["entropy.reference_steps=1"]))
    detectors.observe({"reward/correct_frac": 0.0, "entropy/mean": 2.0})
    state = RunState(step=1, sampler={}, health=detectors.state_dict())
    client = state.to_client_state()
    assert client["health"]["detectors"]["entropy"]["reference"] == 2.0
    assert client["health"]["detectors"]["constant_reward"] == {"streak": 1, "last": 0.0}
    assert RunState.from_client_state(client) == state
    assert "health" not in RunState(step=0, sampler={}).to_client_state()  # before the first step, as before


def test_rewards_that_are_all_errors_for_two_steps_stop_the_run():
    detectors = Detectors(HealthConfig())
    assert detectors.observe({"reward/error_frac": 1.0}) == []
    (firing,) = detectors.observe({"reward/error_frac": 1.0})
    assert (firing.detector, firing.action) == ("reward_errors", "stop")
    assert firing.reason.startswith("reward/error_frac 1 above 0.99 for 2 step(s) in a row")
    fresh = Detectors(HealthConfig())
    assert [fresh.observe({"reward/error_frac": frac}) for frac in (1.0, 0.5, 1.0)] == [[], [], []]

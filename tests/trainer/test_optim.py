"""The learning-rate schedule counts rollout steps: every mini-batch update of rollout step k uses lr(k), also
after resuming from a checkpoint; the formula with exact numbers; the optimizer starts at step 1's lr."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from support.env import REPO, cli_env
from support.metrics import by_step, read_metrics
from tokenpo.trainer.config import TrainerConfig
from tokenpo.trainer.core.optim import build_optimizer, lr_factor, set_step_lr

# warm-up over rollout steps 1-2 (1/3, 2/3 of the peak), decay over steps 3-5: progress (k - 3) / 3
EXPECTED_FACTORS = {
    "constant": [1 / 3, 2 / 3, 1.0, 1.0, 1.0],
    "linear": [1 / 3, 2 / 3, 1.0, 2 / 3, 1 / 3],
    "cosine": [1 / 3, 2 / 3, 1.0, 0.75, 0.25],
}


@pytest.mark.parametrize("schedule", sorted(EXPECTED_FACTORS))
def test_lr_factor_per_rollout_step(schedule):
    got = [lr_factor(step, warmup_steps=2, max_steps=5, schedule=schedule) for step in range(1, 6)]
    assert got == pytest.approx(EXPECTED_FACTORS[schedule], abs=1e-12)


def test_lr_factor_without_warmup_starts_at_the_peak():
    assert lr_factor(1, warmup_steps=0, max_steps=4, schedule="linear") == 1.0
    assert lr_factor(4, warmup_steps=0, max_steps=4, schedule="linear") == 0.25
    assert lr_factor(3, warmup_steps=0, max_steps=4, schedule="cosine") == pytest.approx(0.5 * (1 + math.cos(math.pi / 2)))


def test_optimizer_starts_at_step_one_and_takes_each_steps_lr():
    trainer = TrainerConfig(lr=3e-4, warmup_steps=2, max_steps=5, lr_schedule="cosine")
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1))
    model[1].requires_grad_(False)
    optimizer = build_optimizer(model, trainer)
    assert sum(len(group["params"]) for group in optimizer.param_groups) == 2  # the trainable weight and bias
    assert [group["lr"] for group in optimizer.param_groups] == [pytest.approx(1e-4)]
    assert set_step_lr(optimizer, 4, trainer) == pytest.approx(0.75 * 3e-4)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.75 * 3e-4)


PEAK = 1e-3
# 4 mini-batch updates per rollout step, warm-up over 2 rollout steps; a tiny CPU run with one held-out
# problem and no reference model (the decay runs and the resume take a minute: marked slow)
RUN = ["model=tiny", "logger.mode=disabled", "data.prompts_per_step=4", "rollout.group_size=2",
       "rollout.max_new_tokens=4", "eval.max_problems=1", "trainer.threads=1", "trainer.print_samples=0",
       "reward.num_workers=1", "algorithm.loss.kl_coef=0.0", "trainer.mini_batches=4", "trainer.warmup_steps=2",
       f"trainer.lr={PEAK}"]


def train(run_dir: Path, *overrides: str) -> None:
    """`python -m tokenpo.train` in a subprocess (a process group and DeepSpeed's state stay out of pytest's)."""
    proc = subprocess.run([sys.executable, "-m", "tokenpo.train", *RUN, *overrides, f"hydra.run.dir={run_dir}"],
                          cwd=REPO, env=cli_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]


def logged_lr(run_dir: Path, steps) -> list[float]:
    logged = by_step(read_metrics(run_dir))
    return [logged[step]["lr"] for step in steps]


@pytest.mark.e2e
def test_logged_lr_follows_the_rollout_step_with_four_mini_batches(tmp_path):
    train(tmp_path, "trainer.max_steps=3")
    # warm-up over steps 1-2 of 3, then the peak; per update it would have ended within step 1
    assert logged_lr(tmp_path, [1, 2, 3]) == pytest.approx([PEAK / 3, 2 * PEAK / 3, PEAK], rel=1e-9)


@pytest.fixture(scope="module")
def decay_runs(tmp_path_factory) -> Path:
    """The linear and cosine runs (cosine saving at step 2), and the cosine run resumed from that checkpoint."""
    out = tmp_path_factory.mktemp("lr")
    train(out / "linear", "trainer.max_steps=5", "trainer.lr_schedule=linear")
    cosine = ("trainer.max_steps=5", "trainer.lr_schedule=cosine")
    train(out / "cosine", *cosine, "trainer.save_every=2", "trainer.keep_last=3")
    train(out / "resumed", *cosine, f"trainer.resume={out / 'cosine' / 'checkpoints' / 'step_000002'}")
    return out


@pytest.mark.slow
@pytest.mark.parametrize("schedule", ["linear", "cosine"])
def test_logged_lr_decays_over_rollout_steps_with_four_mini_batches(decay_runs, schedule):
    expected = [PEAK * f for f in EXPECTED_FACTORS[schedule]]
    assert logged_lr(decay_runs / schedule, range(1, 6)) == pytest.approx(expected, rel=1e-9)


@pytest.mark.slow
def test_resumed_run_continues_the_lr_sequence(decay_runs):
    assert sorted(by_step(read_metrics(decay_runs / "resumed"))) == [3, 4, 5]
    assert logged_lr(decay_runs / "resumed", [3, 4, 5]) == logged_lr(decay_runs / "cosine", [3, 4, 5])
    assert logged_lr(decay_runs / "cosine", [3, 4, 5]) == pytest.approx([PEAK, 0.75 * PEAK, 0.25 * PEAK], rel=1e-9)

"""In a training step only the update's forward (with grad) runs in train mode: the old policy's and the reference's
log-probs run without dropout (tokenpo.models.modes), and the policy is back in train mode for the next step."""

from __future__ import annotations

import torch

import pytest

from support.config import SMALL
from support.runs import in_process_training, train_run
from tokenpo.trainer.core import policy


@pytest.mark.e2e
def test_old_and_reference_log_probs_without_dropout_the_update_with_it(tmp_path, monkeypatch):
    passes = []  # (grad enabled, module in train mode) per forward of the step
    forward = policy.Policy._forward

    def spy(self, model, *args):
        passes.append((torch.is_grad_enabled(), getattr(model, "module", model).training))
        return forward(self, model, *args)

    monkeypatch.setattr(policy.Policy, "_forward", spy)
    with in_process_training():
        train_run(tmp_path / "run", SMALL + ["model.lora.rank=2", "model.lora.dropout=0.5", "trainer.mini_batches=2",
                                             "trainer.max_steps=2", "eval.before_training=false",
                                             "eval.every_steps=0"])
    with_grad = [training for grad, training in passes if grad]
    without = [training for grad, training in passes if not grad]
    # per step: old log-probs and the reference (adapters off) without grad, then the two mini-batches' updates
    assert len(without) >= 4 and len(with_grad) >= 4, passes
    assert all(with_grad) and not any(without), passes

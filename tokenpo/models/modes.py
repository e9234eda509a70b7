"""Train/eval mode around the passes that do not train."""

from __future__ import annotations

import contextlib


@contextlib.contextmanager
def no_dropout(module):
    """`module` in eval mode for the body (its mode restored after): sampling rollouts, the old policy's and the
    reference's log-probs and evaluations run without dropout (LoRA's `model.lora.dropout`, a model's own), so the
    ratio's denominator is the policy's deterministic probability and greedy evaluation repeats exactly; only the
    update's forward (with grad) drops units, as PPO-style trainers with dropout do. The vLLM engine has no dropout
    either."""
    training = module.training
    module.eval()
    try:
        yield module
    finally:
        module.train(training)

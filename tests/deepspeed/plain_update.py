"""The one-process reference the multi-process ZeRO tests compare against: the trainer's update on zero_ranks' fixed
batch through a plain-PyTorch AdamW engine, and how two updates are compared."""

from __future__ import annotations

import copy
from pathlib import Path

import torch
import zero_ranks
from transformers import AutoModelForCausalLM

from support.config import compose_config
from tokenpo.models.loading import load_model
from tokenpo.models.logprobs import with_response_pass
from tokenpo.trainer.core.optim import step_lr
from tokenpo.trainer.core.policy import Policy, PolicySettings

# float noise: summation order differs between 1 and 2 processes and between micro-batchings; Adam turns it
# into a few 1e-6 on weights whose gradient nearly cancels (advantages sum to zero within a group)
WEIGHT_ATOL = 5e-5
UPDATE_RTOL = 1e-4
LOSS_ATOL = 1e-6
NORM_RTOL = 1e-5


class PlainEngine:
    """What DeepSpeed does for one process, in plain PyTorch: AdamW at rollout step 1's lr, global-norm clipping."""

    def __init__(self, model, trainer):
        self.module = with_response_pass(model)  # as Policy.build gives it the trainer's passes
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=step_lr(1, trainer), betas=tuple(trainer.adam_betas),
                                           weight_decay=trainer.weight_decay)
        self.max_grad_norm = trainer.max_grad_norm
        self.grad_norm = None

    def __call__(self, *args, **kwargs):  # as DeepSpeed's engine calls its module (the update's pass)
        return self.module(*args, **kwargs)

    def backward(self, loss, scale_wrt_gas=True):
        loss.backward()

    def step(self):
        self.grad_norm = float(torch.nn.utils.clip_grad_norm_(self.module.parameters(), self.max_grad_norm))
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def get_global_grad_norm(self):
        return self.grad_norm

    def get_lr(self):
        return [group["lr"] for group in self.optimizer.param_groups]


def plain_update(micro: str, algorithm: str = "grpo") -> tuple[dict, dict, list]:
    """(metrics, weights, sample) after `algorithm`'s reference update on this process."""
    cfg, _ = compose_config(zero_ranks.update_overrides("zero0", micro, algorithm))
    tokenizer, model = load_model(cfg.model, cfg.seed)
    reference = with_response_pass(copy.deepcopy(model).eval().requires_grad_(False))
    policy = Policy(PlainEngine(model, cfg.trainer), None, reference, torch.device("cpu"),
                    PolicySettings.from_config(cfg))
    metrics = zero_ranks.fixed_update(cfg, policy, tokenizer)
    return (metrics, {k: v.detach().clone() for k, v in model.state_dict().items()},
            zero_ranks.sample(cfg, policy, tokenizer))


def initial_weights() -> dict:
    """The tiny model's weights before any update."""
    cfg, _ = compose_config(zero_ranks.update_overrides("zero0", "whole"))
    return {k: v.detach().clone() for k, v in load_model(cfg.model, cfg.seed)[1].state_dict().items()}


def exported_weights(path: Path) -> dict:
    model = AutoModelForCausalLM.from_pretrained(path)
    assert all(p.dtype == torch.float32 for p in model.parameters())
    return {k: v.detach() for k, v in model.state_dict().items()}


def assert_same_update(got: dict, want: dict, initial: dict, min_change: float) -> None:
    assert got.keys() == want.keys()
    for key in want:
        torch.testing.assert_close(got[key], want[key], rtol=0, atol=WEIGHT_ATOL, msg=key)
    delta_got = torch.cat([(got[k] - initial[k]).flatten() for k in want])
    delta_want = torch.cat([(want[k] - initial[k]).flatten() for k in want])
    assert delta_want.abs().max() > min_change, "the reference update barely moved the weights"
    assert (delta_got - delta_want).norm() <= UPDATE_RTOL * delta_want.norm()

"""Policy on one process: the KL reference is the initial policy (a frozen copy, or with LoRA the policy's own module
with its adapters off, no copy), log-probs with and without grad agree, and an update moves the policy away from it."""

from __future__ import annotations

import pytest
import torch
from support.config import SMALL, compose_config
from support.runs import in_process_training

from tokenpo.deepspeed import dist
from tokenpo.trainer.core.batch import pad_groups
from tokenpo.trainer.core.policy import Policy

KL = ["algorithm=grpo", "algorithm.loss.kl_coef=0.04"]


@pytest.fixture
def build():
    """Policy.build on a process group of one, for the length of the test."""
    with in_process_training():
        dist.init_distributed("gloo")

        def build_policy(overrides: list[str]) -> tuple[object, Policy]:
            cfg, _ = compose_config(SMALL + overrides)
            torch.manual_seed(cfg.seed)
            return Policy.build(cfg, world_size=1, device=torch.device("cpu"))

        yield build_policy


def group_tokens(tokenizer):
    """Two prompts with two responses each."""
    return pad_groups([[5, 6, 7], [8, 9]], [[10, 11, 12], [13], [14, 15], [16, 17, 18, 19]], tokenizer.pad_token_id,
                      torch.device("cpu"))


def one_update(policy: Policy, tokens) -> None:
    out = policy.logprobs(tokens, grad=True, with_entropy=True)
    policy.backward(-(out.logp * tokens.response_mask).sum())
    policy.step()


@pytest.mark.parametrize("lora", [[], ["model.lora.rank=2"]], ids=["copy", "lora"])
def test_reference_is_the_initial_policy_and_stays_it(build, lora):
    tokenizer, policy = build(KL + lora + ["trainer.lr=1e-2", "trainer.warmup_steps=0"])
    assert (policy._reference is None) == bool(lora)  # LoRA: no second copy of the weights
    tokens = group_tokens(tokenizer)
    initial = policy.logprobs(tokens, grad=False, with_entropy=False).logp
    assert torch.equal(policy.reference_logprobs(tokens), initial)
    one_update(policy, tokens)
    assert policy.grad_norm() > 0
    moved = policy.logprobs(tokens, grad=False, with_entropy=False).logp
    mask = tokens.response_mask.bool()
    assert not torch.allclose(moved[mask], initial[mask])
    assert torch.equal(policy.reference_logprobs(tokens), initial)


def test_logprobs_with_grad_are_the_ones_without(build):
    tokenizer, policy = build([])
    tokens = group_tokens(tokenizer)
    with_grad = policy.logprobs(tokens, grad=True, with_entropy=True, entropy_grad=True)
    without = policy.logprobs(tokens, grad=False, with_entropy=True)
    assert with_grad.logp.requires_grad and with_grad.entropy.requires_grad
    assert not without.logp.requires_grad
    assert with_grad.logp.shape == without.logp.shape == tokens.response_ids.shape
    torch.testing.assert_close(with_grad.logp.detach(), without.logp, rtol=0, atol=1e-6)
    torch.testing.assert_close(with_grad.entropy.detach(), without.entropy, rtol=0, atol=1e-6)
    assert policy.logprobs(tokens, grad=False, with_entropy=False).entropy is None


def test_set_lr_is_the_lr_of_the_next_update(build):
    _, policy = build([])
    policy.set_lr(3e-4)
    assert policy.lr() == 3e-4


def test_without_a_kl_term_there_is_no_reference(build):
    tokenizer, policy = build(["algorithm.loss.kl_coef=0.0"])
    with pytest.raises(RuntimeError, match="reference"):
        policy.reference_logprobs(group_tokens(tokenizer))

"""policy_loss for every algorithm: golden values, gradients, micro-batching and the reductions
the spec requires (GTPO α2 = 0 -> DAPO, GRPO-S β2 = 0 -> sequence-ratio GRPO)."""

from __future__ import annotations

import math

import pytest
import torch

from support.config import ALGORITHM_NAMES, train_config
from tokenpo.algorithms import (
    KL_MASKS,
    SURROGATES,
    LossNorm,
    clipped_surrogate,
    kl_mask_entropy_reference,
    policy_loss,
    token_advantages,
)


# Two responses: ratios 1.5, 1.0 | 0.5 (second token padding); advantages +1, +1 | -1.
MASK = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
ADVANTAGES = torch.tensor([[1.0, 1.0], [-1.0, 0.0]])
LOG_RATIO = torch.tensor([[math.log(1.5), 0.0], [math.log(0.5), 0.0]])
OLD_LOGP = torch.tensor([[-1.0, -2.0], [-0.5, -3.0]])


def k3(d: float) -> float:
    return math.exp(d) - d - 1


def run(cfg, log_ratio, advantages, mask, max_len=4, **kwargs):
    """Loss, metrics and d loss / d logp for logp = old_logp + log_ratio."""
    old_logp = OLD_LOGP if log_ratio.shape == OLD_LOGP.shape else torch.zeros_like(log_ratio)
    logp = (old_logp + log_ratio).requires_grad_(True)
    loss, metrics = policy_loss(cfg, logp, old_logp, advantages, mask, LossNorm.from_mask(mask, max_len), **kwargs)
    loss.backward()
    return loss.item(), metrics, logp.grad


def test_clipped_surrogate_golden():
    ratio = torch.tensor([1.5, 0.5, 0.5, 1.5, 1.1, 4.0])
    advantages = torch.tensor([1.0, 1.0, -1.0, -1.0, 1.0, -1.0])
    plain = clipped_surrogate(ratio, advantages, 0.2, 0.28)
    torch.testing.assert_close(plain, torch.tensor([-1.28, -0.5, 0.8, 1.5, -1.1, 4.0]))
    dual = clipped_surrogate(ratio, advantages, 0.2, 0.28, dual_clip=3.0)
    torch.testing.assert_close(dual, torch.tensor([-1.28, -0.5, 0.8, 1.5, -1.1, 3.0]))


def test_grpo_loss_golden(load_algorithm):
    # tokens: max(-1.5, -1.2) = -1.2, -1 | max(0.5, 0.8) = 0.8, plus 0.04·k3(ln2) where ref differs
    ref_logp = OLD_LOGP + LOG_RATIO + torch.tensor([[0.0, 0.0], [math.log(2), 0.0]])
    loss, metrics, _ = run(load_algorithm("grpo"), LOG_RATIO, ADVANTAGES, MASK, ref_logp=ref_logp)
    kl = 0.04 * k3(math.log(2))
    assert loss == pytest.approx(((-1.2 - 1.0) / 2 + 0.8 + kl) / 2)
    assert metrics["loss/pg"] == pytest.approx(((-1.2 - 1.0) / 2 + 0.8) / 2)
    assert metrics["loss/kl"] == pytest.approx(kl / 2)
    assert metrics["kl/ref"] == pytest.approx(k3(math.log(2)) / 3, rel=1e-5)
    assert metrics["kl/old"] == pytest.approx((k3(-math.log(1.5)) + k3(math.log(2))) / 3, rel=1e-5)
    assert (metrics["clip/low_frac"], metrics["clip/high_frac"]) == (pytest.approx(1 / 3), pytest.approx(1 / 3))
    assert "clip/dual_frac" not in metrics and "tepo/mask_frac" not in metrics


def test_grpo_refuses_to_run_without_the_reference(load_algorithm):
    with pytest.raises(ValueError, match="algorithm.loss.kl_target is 'ref' but policy_loss got ref_logp=None"):
        run(load_algorithm("grpo"), LOG_RATIO, ADVANTAGES, MASK)


def test_dapo_loss_golden(load_algorithm):
    # clip-higher: max(-1.5, -1.28) = -1.28; token-mean over 3 tokens
    loss, metrics, grad = run(load_algorithm("dapo"), LOG_RATIO, ADVANTAGES, MASK)
    assert loss == pytest.approx((-1.28 - 1.0 + 0.8) / 3)
    # only the unclipped token (ratio 1) moves: d(-A·w)/d logp = -w/3
    torch.testing.assert_close(grad, torch.tensor([[0.0, -1 / 3], [0.0, 0.0]]))
    assert (metrics["clip/low_frac"], metrics["clip/high_frac"]) == (pytest.approx(1 / 3), pytest.approx(1 / 3))


def test_dual_clip_fraction(load_algorithm):
    cfg = load_algorithm("dapo", loss={"dual_clip": 3.0})
    log_ratio = torch.tensor([[0.0, 0.0], [math.log(4.0), 0.0]])
    loss, metrics, _ = run(cfg, log_ratio, ADVANTAGES, MASK)
    assert loss == pytest.approx((-1.0 - 1.0 + 3.0) / 3)
    assert metrics["clip/dual_frac"] == pytest.approx(1 / 3)


def test_dr_grpo_loss_golden(load_algorithm):
    loss, _, _ = run(load_algorithm("dr_grpo"), LOG_RATIO, ADVANTAGES, MASK, max_len=4)
    assert loss == pytest.approx((-1.2 - 1.0 + 0.8) / (2 * 4))


def test_gspo_loss_golden(load_algorithm):
    # s_0 = sqrt(1.5) clipped to 1 + 4e-4; s_1 = 0.5 clipped to 1 - 3e-4; one term per sequence
    loss, _, _ = run(load_algorithm("gspo"), LOG_RATIO, ADVANTAGES, MASK)
    assert loss == pytest.approx((-(1 + 4e-4) + (1 - 3e-4)) / 2, abs=1e-7)  # float32 cancellation


# GTPO / GRPO-S data: one group, O+ = {0, 1}, O− = {2} (advantages hand-computed in test_advantages.py)
ENTROPY_REWARDS = torch.tensor([1.0, 1.0, -1.0])
ENTROPY_MASK = torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, 1.0]])
ENTROPY_GROUPS = torch.zeros(3, dtype=torch.long)


def test_gtpo_loss_golden(load_algorithm):
    cfg = load_algorithm("gtpo")
    entropy = torch.tensor([[1.0, 2.0], [3.0, 9.0], [0.5, 2.0]])
    advantages = token_advantages(cfg, ENTROPY_REWARDS, ENTROPY_REWARDS > 0, ENTROPY_GROUPS, ENTROPY_MASK, entropy)
    hand = torch.tensor([[0.528144, 0.567266], [0.606388, 0.0], [-1.154093, -1.154093]])
    loss, _, grad = run(cfg, torch.zeros(3, 2), advantages, ENTROPY_MASK)
    # ratio 1 everywhere: loss = -Σ A / 5 tokens, gradient -A / 5 per token
    assert loss == pytest.approx(-hand.sum().item() / 5, abs=1e-5)
    torch.testing.assert_close(grad, -hand / 5, atol=1e-6, rtol=1e-5)


def test_grpo_s_loss_golden(load_algorithm):
    cfg = load_algorithm("grpo_s")
    entropy = torch.tensor([[1.0, 3.0], [6.0, 100.0], [0.5, 1.5]])
    advantages = token_advantages(cfg, ENTROPY_REWARDS, ENTROPY_REWARDS > 0, ENTROPY_GROUPS, ENTROPY_MASK, entropy)
    # arithmetic sequence ratios 1.25, 0.9, 0.7 (clipped to 0.8 for the negative one)
    log_ratio = torch.log(torch.tensor([[1.5, 1.0], [0.9, 1.0], [1.0, 0.4]]))
    loss, _, _ = run(cfg, log_ratio, advantages, ENTROPY_MASK)
    a = [0.537569, 0.616238, -1.153807]
    assert loss == pytest.approx((-1.25 * a[0] - 0.9 * a[1] + 0.8 * -a[2]) / 3, abs=1e-5)


def test_tepo_loss_golden(load_algorithm):
    cfg = load_algorithm("tepo")
    rewards = torch.tensor([1.0, 0.0])
    mask = torch.ones(2, 2)
    advantages = token_advantages(cfg, rewards, rewards > 0, torch.zeros(2), mask)
    torch.testing.assert_close(advantages, torch.tensor([[1.0, 1.0], [-1.0, -1.0]]) / math.sqrt(2), atol=1e-5, rtol=0)
    log_ratio = torch.tensor([[math.log(1.1)] * 2, [0.0, 0.0]])
    entropy = torch.tensor([[1.0, 2.0], [0.5, 0.5]])
    old_entropy = torch.tensor([[1.5, 1.5], [1.0, 1.0]])
    # s_0 = 1.1 (inside 0.8..1.28); the mask keeps only token (0, 0): A > 0 and entropy fell
    loss, metrics, _ = run(cfg, log_ratio, advantages, mask, entropy=entropy, entropy_reference=old_entropy)
    a = 1 / math.sqrt(2)
    assert loss == pytest.approx((2 * -a * 1.1 + 2 * a + 0.05 * k3(-math.log(1.1))) / 4, abs=1e-6)
    assert metrics["tepo/mask_frac"] == 0.25


def test_tepo_mask_selects_positive_advantage_tokens_whose_entropy_fell():
    torch.manual_seed(3)
    advantages = torch.randn(5, 6)
    entropy, old_entropy = torch.rand(5, 6), torch.rand(5, 6)
    mask = (torch.arange(6)[None, :] < torch.tensor([6, 3, 1, 5, 4])[:, None]).float()
    selected = KL_MASKS.get("tepo")(advantages, entropy, old_entropy, mask)
    for i in range(5):
        for t in range(6):
            expected = mask[i, t] == 1 and advantages[i, t] > 0 and entropy[i, t] < old_entropy[i, t]
            assert selected[i, t].item() == float(expected)
    assert 0 < selected.sum() < mask.sum()


def test_tepo_masked_kl_gradient_lands_only_on_masked_tokens(load_algorithm):
    torch.manual_seed(4)
    advantages = torch.randn(4, 5)
    mask = (torch.arange(5)[None, :] < torch.tensor([5, 2, 4, 3])[:, None]).float()
    entropy, old_entropy = torch.rand(4, 5), torch.rand(4, 5)
    log_ratio = torch.randn(4, 5) * 0.05
    args = (log_ratio, advantages, mask)
    _, _, with_kl = run(load_algorithm("tepo"), *args, entropy=entropy, entropy_reference=old_entropy)
    _, _, without = run(load_algorithm("tepo", loss={"kl_mask_coef": 0.0}), *args, entropy=entropy, entropy_reference=old_entropy)
    selected = KL_MASKS.get("tepo")(advantages, entropy, old_entropy, mask)
    # d k3(old - logp) / d logp = 1 - exp(old - logp); token-mean over the 14 real tokens
    expected = 0.05 * (1 - torch.exp(-log_ratio)) * selected / mask.sum()
    torch.testing.assert_close(with_kl - without, expected, atol=1e-7, rtol=1e-4)


def test_kl_mask_entropy_references(load_algorithm):
    old_entropy = torch.tensor([[1.0, 3.0], [4.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    groups = torch.tensor([5, 8])

    def reference(choice):
        return kl_mask_entropy_reference(load_algorithm("tepo", loss={"kl_mask_entropy_ref": choice}), old_entropy, mask, groups)

    torch.testing.assert_close(reference("old_token"), old_entropy)
    torch.testing.assert_close(reference("group_mean"), torch.tensor([[2.0, 2.0], [4.0, 4.0]]))
    torch.testing.assert_close(reference("batch_mean"), torch.full((2, 2), 8 / 3))


BATCH = 8


def random_step(seed, batch=BATCH, length=7):
    """Random inputs of one step: 2 groups of 4 with two O+ in the first, ragged lengths, small drift."""
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([7, 1, 4, 6, 2, 5, 3, 7])
    mask = (torch.arange(length)[None, :] < lengths[:, None]).to(torch.float64)
    old_logp = -torch.rand(batch, length, generator=generator, dtype=torch.float64) * 3
    return dict(
        mask=mask,
        old_logp=old_logp,
        log_ratio=torch.randn(batch, length, generator=generator, dtype=torch.float64) * 0.2,
        ref_logp=old_logp + torch.randn(batch, length, generator=generator, dtype=torch.float64) * 0.3,
        entropy=torch.rand(batch, length, generator=generator, dtype=torch.float64) * 2,
        old_entropy=torch.rand(batch, length, generator=generator, dtype=torch.float64) * 2,
        rewards=torch.tensor([1.0, -1.0, -1.0, 1.0, 1.0, -1.0, -1.0, -1.0], dtype=torch.float64),
        groups=torch.tensor([0, 0, 0, 0, 1, 1, 1, 1]),
    )


def step_loss(cfg, step, splits):
    """Sum of policy_loss over micro-batches of `splits` rows, and d loss / d logp."""
    correct = step["rewards"] > 0
    advantages = token_advantages(cfg, step["rewards"], correct, step["groups"], step["mask"], step["old_entropy"])
    entropy_ref = kl_mask_entropy_reference(cfg, step["old_entropy"], step["mask"], step["groups"])
    logp = (step["old_logp"] + step["log_ratio"]).requires_grad_(True)
    # the current entropy with grad, as the trainer hands it to a config with an entropy bonus
    entropy = step["entropy"].clone().requires_grad_(True)
    norm = LossNorm.from_mask(step["mask"], 9)
    parts = [
        torch.split(tensor, splits)
        for tensor in (logp, step["old_logp"], advantages, step["mask"], step["ref_logp"], entropy, entropy_ref)
    ]
    total = sum(
        policy_loss(cfg, lp, old, adv, m, norm, ref_logp=ref, entropy=ent, entropy_reference=old_ent)[0]
        for lp, old, adv, m, ref, ent, old_ent in zip(*parts)
    )
    total.backward()
    return total, logp.grad


def selects_tokens(name: str) -> bool:
    """Whether the shipped algorithm picks tokens (Clip-Cov, KL-Cov, 80/20): picked per micro-batch its update depends
    on the split by design, and step-wide it goes through prepare_step (both in test_selection.py)."""
    loss = train_config(f"algorithm={name}").algorithm.loss
    return SURROGATES.trait(loss.surrogate, "select") is not None or loss.entropy_top_frac is not None


UNSELECTING = tuple(name for name in ALGORITHM_NAMES if not selects_tokens(name))


@pytest.mark.parametrize("name", UNSELECTING)
@pytest.mark.parametrize("splits", [[1, 3, 4], [4, 4], [2, 1, 1, 4]])
def test_micro_batches_give_the_full_batch_loss_and_gradient(load_algorithm, name, splits):
    cfg = load_algorithm(name)
    step = random_step(seed=7)
    full, full_grad = step_loss(cfg, step, [BATCH])
    micro, micro_grad = step_loss(cfg, step, splits)
    torch.testing.assert_close(micro, full)
    torch.testing.assert_close(micro_grad, full_grad)


@pytest.mark.parametrize("name", UNSELECTING)  # a selection stops or masks some tokens' gradient by design
def test_gradient_reaches_every_real_token_and_no_padding(load_algorithm, name):
    # ratio 1 (inside every clip) and nonzero advantages: each real token must get a gradient
    step = random_step(seed=11)
    step["log_ratio"] = torch.zeros_like(step["log_ratio"])
    _, grad = step_loss(load_algorithm(name), step, [BATCH])
    assert (grad[step["mask"] == 0] == 0).all()
    assert (grad[step["mask"] == 1] != 0).all()


def test_kl_term_carries_gradient_without_advantage(load_algorithm):
    # GRPO with A = 0: only β·k3(ref) moves the policy; d k3 / d logp = 1 - exp(ref - logp)
    log_ratio = torch.tensor([[0.1, -0.2], [0.3, 0.0]])
    ref_logp = OLD_LOGP
    _, _, grad = run(load_algorithm("grpo"), log_ratio, torch.zeros(2, 2), MASK, ref_logp=ref_logp)
    sequence_lengths = torch.tensor([[2.0], [1.0]])
    expected = 0.04 * (1 - torch.exp(-log_ratio)) / sequence_lengths / 2 * MASK
    torch.testing.assert_close(grad, expected)


def test_entropy_and_advantages_receive_no_gradient(load_algorithm):
    cfg = load_algorithm("tepo")
    advantages = torch.tensor([[0.5, 0.5], [-0.5, 0.0]], requires_grad=True)
    entropy = torch.tensor([[0.1, 0.2], [0.3, 0.4]], requires_grad=True)
    old_entropy = torch.ones(2, 2, requires_grad=True)
    run(cfg, LOG_RATIO, advantages, MASK, entropy=entropy, entropy_reference=old_entropy)
    assert advantages.grad is None and entropy.grad is None and old_entropy.grad is None


@pytest.mark.parametrize("kind", ["sequence_geometric", "sequence_arithmetic"])
def test_sequence_losses_are_one_clipped_term_per_sequence(load_algorithm, kind):
    cfg = load_algorithm("gspo", ratio={"kind": kind}, loss={"clip_low": 0.1, "clip_high": 0.1})
    step = random_step(seed=5)
    advantages = token_advantages(cfg, step["rewards"], step["rewards"] > 0, step["groups"], step["mask"])
    logp = (step["old_logp"] + step["log_ratio"]).requires_grad_(True)
    loss, _ = policy_loss(cfg, logp, step["old_logp"], advantages, step["mask"], LossNorm.from_mask(step["mask"], 9))
    loss.backward()

    reference_logp = (step["old_logp"] + step["log_ratio"]).requires_grad_(True)
    terms = []
    for i in range(BATCH):
        real = step["mask"][i] == 1
        log_w = reference_logp[i][real] - step["old_logp"][i][real]
        s = torch.exp(log_w.mean()) if kind == "sequence_geometric" else torch.exp(log_w).mean()
        a = advantages[i, 0]
        terms.append(torch.maximum(-a * s, -a * s.clamp(0.9, 1.1)))
    reference = torch.stack(terms).mean()
    reference.backward()
    torch.testing.assert_close(loss, reference)
    torch.testing.assert_close(logp.grad, reference_logp.grad)


def test_gtpo_with_alpha2_zero_gives_the_dapo_loss(load_algorithm):
    step = random_step(seed=9)
    gtpo, gtpo_grad = step_loss(load_algorithm("gtpo", advantage={"alpha2": 0.0}), step, [BATCH])
    dapo, dapo_grad = step_loss(load_algorithm("dapo"), step, [BATCH])
    torch.testing.assert_close(gtpo, dapo)
    torch.testing.assert_close(gtpo_grad, dapo_grad)
    assert not torch.isclose(step_loss(load_algorithm("gtpo"), step, [BATCH])[0], dapo)


def test_grpo_s_with_beta2_zero_is_a_sequence_ratio_grpo(load_algorithm):
    step = random_step(seed=10)
    grpo_s, grpo_s_grad = step_loss(load_algorithm("grpo_s", advantage={"beta2": 0.0}), step, [BATCH])
    sequence_grpo = load_algorithm(
        "grpo", reward={"wrong": -1.0}, ratio={"kind": "sequence_arithmetic"}, loss={"kl_coef": 0.0, "clip_high": 0.28}
    )
    grpo, grpo_grad = step_loss(sequence_grpo, step, [BATCH])
    torch.testing.assert_close(grpo_s, grpo)
    torch.testing.assert_close(grpo_s_grad, grpo_grad)


def test_entropy_bonus_golden_and_gradient(load_algorithm):
    """loss.entropy_coef c: loss − c · aggregated entropy, with d loss / d H = −c · (the aggregation's weights)."""
    entropy = torch.tensor([[2.0, 1.0], [0.5, 9.0]], requires_grad=True)
    plain, plain_metrics, _ = run(load_algorithm("dapo"), LOG_RATIO, ADVANTAGES, MASK, entropy=entropy.detach())
    loss, metrics, _ = run(load_algorithm("dapo", loss={"entropy_coef": 0.01}), LOG_RATIO, ADVANTAGES, MASK,
                           entropy=entropy)
    # DAPO's token-mean over the 3 real tokens: (2 + 1 + 0.5) / 3; the padded 9 counts nowhere
    assert loss == pytest.approx(plain - 0.01 * 3.5 / 3, abs=1e-7)
    assert metrics["loss/entropy"] == pytest.approx(-0.01 * 3.5 / 3)
    assert "loss/entropy" not in plain_metrics
    torch.testing.assert_close(entropy.grad, -0.01 * MASK / 3)


def test_entropy_bonus_refuses_a_detached_entropy(load_algorithm):
    with pytest.raises(ValueError, match="entropy_coef needs the current entropy with its gradient; got a detached"):
        run(load_algorithm("dapo", loss={"entropy_coef": 0.01}), LOG_RATIO, ADVANTAGES, MASK, entropy=torch.ones(2, 2))

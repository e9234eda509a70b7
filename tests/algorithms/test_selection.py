"""Token selection of Clip-Cov / KL-Cov (arXiv 2505.22617 §4) and 80/20 (arXiv 2506.01939 §5): the pure functions of
tokenpo/algorithms/selection.py and the surrogates against plain loops over tokens (loss and gradient wrt logp), their
boundaries, and `selection_scope: step`, whose total gradient does not depend on how the step is split into ranks and
micro-batches (the reference's micro_batch scope does)."""

from __future__ import annotations

import random

import pytest
import torch

from tokenpo.algorithms import (
    LossNorm,
    StepBatch,
    algorithm_config_from_dict,
    micro_batch_loss,
    policy_loss,
    prepare_step,
    response_mask,
)
from tokenpo.algorithms.selection import (
    entropy_top_mask,
    random_pick,
    selection_count,
    selection_generator,
    token_covariance,
    top_quantile_threshold,
)

CLIP = 0.2


def config(surrogate="clipped", **loss):
    """Token-mean, no KL to a reference: the loop references below sum the surrogate over tokens / N."""
    return algorithm_config_from_dict({"aggregation": "token-mean",
                                       "loss": {"surrogate": surrogate, "kl_coef": 0.0, **loss}})


def hand_batch(seed=0, rows=6, width=5, spread=6.0):
    """[rows, width] advantages (±1.5 per row, as a group advantage), old and new log-probs spread over
    [−spread, 0] (so |Cov| reaches the (1, 5) band), entropy, and a mask of lengths 1..width."""
    rng = random.Random(seed)
    lengths = torch.tensor([width] + [rng.randint(1, width) for _ in range(rows - 1)])
    mask = response_mask(lengths)
    adv = torch.tensor([[rng.choice([-1.5, 1.5])] * width for _ in range(rows)]) * mask
    old = torch.tensor([[-rng.uniform(0.0, spread) for _ in range(width)] for _ in range(rows)])
    new = old + torch.tensor([[rng.gauss(0.0, 0.3) for _ in range(width)] for _ in range(rows)])
    entropy = torch.tensor([[rng.uniform(0.0, 2.0) for _ in range(width)] for _ in range(rows)])
    return adv, old, new, entropy, mask


def valid_tokens(mask):
    return [(i, t) for i in range(mask.shape[0]) for t in range(mask.shape[1]) if mask[i, t] > 0]


def loop_covariance(adv, logp, mask):
    tokens = valid_tokens(mask)
    mean_a = sum(float(adv[i, t]) for i, t in tokens) / len(tokens)
    mean_l = sum(float(logp[i, t]) for i, t in tokens) / len(tokens)
    return {(i, t): (float(adv[i, t]) - mean_a) * (float(logp[i, t]) - mean_l) for i, t in tokens}


def loss_and_grad(cfg, new, old, adv, mask, **kwargs):
    logp = new.clone().requires_grad_(True)
    loss, metrics = policy_loss(cfg, logp, old, adv, mask, LossNorm.from_mask(mask, mask.shape[1]), **kwargs)
    loss.backward()
    return loss.detach(), logp.grad, metrics


def loop_loss_and_grad(new, mask, token_loss):
    """Σ_t token_loss(t, logp_t) / N over the valid tokens, and its gradient, one token at a time."""
    tokens = valid_tokens(mask)
    grad = torch.zeros_like(new)
    total = 0.0
    for i, t in tokens:
        leaf = new[i, t].clone().requires_grad_(True)
        value = token_loss(i, t, leaf) / len(tokens)
        value.backward()
        total += float(value.detach())
        grad[i, t] = leaf.grad
    return torch.tensor(total), grad


def test_token_covariance_is_the_plain_loop():
    adv, old, new, _, mask = hand_batch()
    cov = token_covariance(adv, new, mask)
    for (i, t), value in loop_covariance(adv, new, mask).items():
        assert float(cov[i, t]) == pytest.approx(value, rel=1e-5, abs=1e-6)
    assert (cov * (1 - mask)).abs().max() == 0


@pytest.mark.parametrize(("tokens", "rho", "k"), [(5000, 2e-4, 1), (1000, 2e-4, 1), (20000, 2e-4, 4),
                                                   (10, 0.2, 2), (3, 0.2, 1), (0, 0.2, 0)])
def test_selection_count_keeps_at_least_one_token(tokens, rho, k):
    """k = max(1, ⌊ρ·N⌋): at the testbed's scale ρ·N < 1, one token; none of an empty batch."""
    assert selection_count(tokens, rho) == k


def test_random_pick_is_a_seeded_uniform_subset():
    candidates = torch.rand(4, 6, generator=torch.Generator().manual_seed(1)) > 0.4
    picked = random_pick(candidates, 3, selection_generator(7, 1, 0))
    assert int(picked.sum()) == 3 and not (picked & ~candidates).any()
    assert torch.equal(picked, random_pick(candidates, 3, selection_generator(7, 1, 0)))
    assert int(random_pick(candidates, 100, selection_generator(7, 1, 0)).sum()) == int(candidates.sum())
    draws = {tuple(random_pick(candidates, 3, selection_generator(7, step, 0)).flatten().tolist())
             for step in range(20)}
    assert len(draws) > 10  # the step moves the draw


def test_clip_cov_matches_the_loop_and_picks_among_unclipped_band_tokens():
    """Clip-Cov: k of the valid tokens with 1 < Cov < 5 not cut by the clip, drawn at random; the clipped surrogate
    on the others, 0 on them; token-mean over every valid token."""
    adv, old, new, _, mask = hand_batch()
    cfg = config("clip_cov", cov_rho=0.1)
    loss, grad, metrics = loss_and_grad(cfg, new, old, adv, mask, generator=selection_generator(0, 0, 0, 0))
    cov = loop_covariance(adv, new, mask)
    ratio = (new - old).exp()
    candidates = {key for key, value in cov.items() if 1 < value < 5 and not (
        -float(adv[key]) * min(max(float(ratio[key]), 1 - CLIP), 1 + CLIP) > -float(adv[key]) * float(ratio[key]))}
    k = max(1, int(0.1 * len(cov)))
    assert len(candidates) > k  # the pick is a real choice here
    # the pick, read back from which tokens lost their gradient while the clip left them one
    stopped = {key for key in candidates if grad[key] == 0}
    assert len(stopped) == k
    assert metrics["clip_cov/selected_frac"] == pytest.approx(k / len(cov))

    def token_loss(i, t, logp):
        if (i, t) in stopped:
            return logp * 0.0
        r = (logp - old[i, t]).exp()
        a = adv[i, t]
        return torch.maximum(-a * r, -a * r.clamp(1 - CLIP, 1 + CLIP))

    expected_loss, expected_grad = loop_loss_and_grad(new, mask, token_loss)
    torch.testing.assert_close(loss, expected_loss)
    torch.testing.assert_close(grad, expected_grad)


def test_clip_cov_with_no_token_in_the_band_is_the_clipped_surrogate():
    """Covariances far below ω_low = 1 (log-probs close together): nothing is stopped."""
    adv, old, new, _, mask = hand_batch(spread=0.1)
    clip_cov = loss_and_grad(config("clip_cov", cov_rho=0.5), new, old, adv, mask,
                             generator=selection_generator(0))
    clipped = loss_and_grad(config("clipped"), new, old, adv, mask)
    torch.testing.assert_close(clip_cov[0], clipped[0])
    torch.testing.assert_close(clip_cov[1], clipped[1])
    assert clip_cov[2]["clip_cov/selected_frac"] == 0


def test_clip_cov_needs_a_generator_for_its_own_pick():
    adv, old, new, _, mask = hand_batch()
    with pytest.raises(ValueError, match="torch.Generator"):
        loss_and_grad(config("clip_cov"), new, old, adv, mask)


def test_kl_cov_matches_the_loop():
    """KL-Cov: −A·w on every token (no clip), + β·|logp − old| on the k tokens of largest Cov."""
    adv, old, new, _, mask = hand_batch(seed=3)
    beta, rho = 1.0, 0.15
    loss, grad, metrics = loss_and_grad(config("kl_cov", cov_rho=rho, kl_cov_coef=beta), new, old, adv, mask)
    cov = loop_covariance(adv, new, mask)
    k = max(1, int(rho * len(cov)))
    top = set(sorted(cov, key=cov.get, reverse=True)[:k])
    assert metrics["kl_cov/selected_frac"] == pytest.approx(k / len(cov))
    assert metrics["cov/mean"] == pytest.approx(sum(cov.values()) / len(cov), rel=1e-5)

    def token_loss(i, t, logp):
        value = -adv[i, t] * (logp - old[i, t]).exp()
        return value + beta * (logp - old[i, t]).abs() if (i, t) in top else value

    expected_loss, expected_grad = loop_loss_and_grad(new, mask, token_loss)
    torch.testing.assert_close(loss, expected_loss)
    torch.testing.assert_close(grad, expected_grad)


def test_zero_advantages():
    """All A = 0: every Cov is 0, so Clip-Cov has no candidate (nothing stopped, zero loss); KL-Cov still puts β·|Δ|
    on k tokens (ties at 0: the reference's topk picks k all the same)."""
    _, old, new, _, mask = hand_batch()
    adv = torch.zeros_like(mask)
    loss, grad, metrics = loss_and_grad(config("clip_cov", cov_rho=0.2), new, old, adv, mask,
                                        generator=selection_generator(0))
    assert float(loss) == 0 and metrics["clip_cov/selected_frac"] == 0 and grad.abs().max() == 0
    loss, grad, metrics = loss_and_grad(config("kl_cov", cov_rho=0.2), new, old, adv, mask)
    k = max(1, int(0.2 * mask.sum()))
    assert int((grad != 0).sum()) == k
    assert float(loss) > 0


def test_one_token_responses_select_one_token():
    """Responses of one token each, ρ·N < 1: KL-Cov penalises exactly the one token of largest Cov."""
    adv, old, new, _, _ = hand_batch(seed=5)
    mask = response_mask(torch.ones(6, dtype=torch.long))
    adv, old, new = adv[:, :1] * mask, old[:, :1], new[:, :1]
    _, grad, metrics = loss_and_grad(config("kl_cov", cov_rho=2e-4), new, old, adv, mask)
    assert metrics["kl_cov/selected_frac"] == pytest.approx(1 / 6)
    cov = loop_covariance(adv, new, mask)
    top = max(cov, key=cov.get)
    plain = -adv * (new - old).exp() / 6
    assert grad[top] == pytest.approx(float(plain[top] + (new[top] - old[top]).sign() / 6), rel=1e-5)


def test_top_quantile_threshold_is_torch_quantile():
    _, _, _, entropy, mask = hand_batch()
    for frac in (0.2, 0.5, 1.0):
        expected = torch.quantile(entropy[mask > 0], 1 - frac)
        torch.testing.assert_close(top_quantile_threshold(entropy, mask, frac), expected)
    assert top_quantile_threshold(entropy, torch.zeros_like(mask), 0.2) == float("inf")


def test_entropy_top_keeps_the_top_fraction_and_the_normaliser():
    """80/20: only tokens with H ≥ the batch's 80th percentile carry the clipped surrogate; the loss still divides by
    every valid token (J_HighEnt's 1/Σ|o_i|, TRL multiplies the per-token loss)."""
    adv, old, new, entropy, mask = hand_batch(seed=2)
    loss, grad, metrics = loss_and_grad(config("clipped", entropy_top_frac=0.2), new, old, adv, mask,
                                        entropy=entropy)
    values = sorted(float(entropy[key]) for key in valid_tokens(mask))
    position = (len(values) - 1) * 0.8
    low = int(position)
    tau = values[low] + (values[min(low + 1, len(values) - 1)] - values[low]) * (position - low)
    kept = {key for key in valid_tokens(mask) if float(entropy[key]) >= tau}
    assert metrics["entropy_top/threshold"] == pytest.approx(tau, rel=1e-6)
    assert metrics["entropy_top/kept_frac"] == pytest.approx(len(kept) / len(values))

    def token_loss(i, t, logp):
        r = (logp - old[i, t]).exp()
        value = torch.maximum(-adv[i, t] * r, -adv[i, t] * r.clamp(1 - CLIP, 1 + CLIP))
        return value if (i, t) in kept else value * 0.0

    expected_loss, expected_grad = loop_loss_and_grad(new, mask, token_loss)
    torch.testing.assert_close(loss, expected_loss)
    torch.testing.assert_close(grad, expected_grad)


def test_entropy_top_mask_of_an_empty_batch_keeps_nothing():
    keep, _ = entropy_top_mask(torch.ones(2, 3), torch.zeros(2, 3), 0.2)
    assert not keep.any()


# --- selection_scope step: one pick per mini-batch of the step, the same under any split ---

GROUPS, G, WIDTH = 4, 4, 6


def step_batch(mini_batches=1, step=3, seed=11):
    """4 groups of 4 mixed responses, lengths 1..6; old log-probs spread over [−6, 0] and entropies per token."""
    rng = random.Random(0)
    n = GROUPS * G
    lengths = torch.tensor([WIDTH] + [rng.randint(1, WIDTH) for _ in range(n - 1)])
    mask = response_mask(lengths)
    correct = torch.tensor([(i % G) in (0, 3) for i in range(n)])
    old = torch.tensor([[-rng.uniform(0.0, 6.0) for _ in range(WIDTH)] for _ in range(n)]) * mask
    entropy = torch.tensor([[rng.uniform(0.0, 2.0) for _ in range(WIDTH)] for _ in range(n)]) * mask
    return StepBatch(correct=correct, valid=torch.ones(n, dtype=torch.bool), truncated=torch.zeros(n, dtype=torch.bool),
                     in_format=torch.zeros(n), lengths=lengths, group_ids=torch.arange(n) // G, mask=mask,
                     max_new_tokens=WIDTH, mini_batches=mini_batches, old_entropy=entropy, old_logp=old, seed=seed,
                     step=step)


SPLITS = {
    "one rank, one micro-batch": lambda groups: [groups],
    "two ranks": lambda groups: [groups[0::2], groups[1::2]],  # the trainer's rank r trains groups r, r + 2, ...
    "micro-batches of one group": lambda groups: [[g] for g in groups],
}

STEP_CONFIGS = {
    "clip_cov": dict(surrogate="clip_cov", cov_rho=0.1),
    "kl_cov": dict(surrogate="kl_cov", cov_rho=0.1),
    "entropy_top": dict(entropy_top_frac=0.2),
}


def total_gradient(cfg, batch, split, drift=0.3):
    """Σ over the split's micro-batches of micro_batch_loss, back-propagated to one [N, T] leaf of log-probs that
    have drifted from the rollout's (so the ratio and the clip act)."""
    step = prepare_step(cfg, batch)
    noise = torch.randn(batch.mask.shape, generator=torch.Generator().manual_seed(4)) * drift
    logp = (batch.old_logp + noise).requires_grad_(True)
    per_mini = GROUPS // batch.mini_batches
    total = 0.0
    for mini_batch in range(batch.mini_batches):
        groups = list(range(mini_batch * per_mini, (mini_batch + 1) * per_mini))
        for micro in split(groups):
            rows = [g * G + j for g in micro for j in range(G)]
            loss, _ = micro_batch_loss(cfg, step, rows, mini_batch, logp[rows], batch.old_entropy[rows],
                                       old_logp=batch.old_logp[rows])
            total = total + loss
    total.backward()
    return logp.grad, step


@pytest.mark.parametrize("mini_batches", [1, 2])
@pytest.mark.parametrize("name", sorted(STEP_CONFIGS))
def test_step_scope_gradient_does_not_depend_on_the_split(name, mini_batches):
    cfg = config(**STEP_CONFIGS[name], selection_scope="step")
    batch = step_batch(mini_batches)
    grads = {label: total_gradient(cfg, batch, split)[0] for label, split in SPLITS.items()}
    reference = grads.pop("one rank, one micro-batch")
    for grad in grads.values():
        torch.testing.assert_close(grad, reference, rtol=1e-6, atol=1e-7)
    _, step = total_gradient(cfg, batch, SPLITS["two ranks"])
    picks = step.selection if step.selection is not None else step.entropy_keep
    assert picks is not None and picks.any()
    assert not (picks & (step.loss_mask == 0)).any()


@pytest.mark.parametrize("name", ["kl_cov", "entropy_top"])
def test_micro_batch_scope_depends_on_the_split(name):
    """The reference codes' scope: each micro-batch ranks its own tokens, so the step's gradient changes with the
    split (what selection_scope step removes)."""
    cfg = config(**STEP_CONFIGS[name])
    batch = step_batch()
    whole = total_gradient(cfg, batch, SPLITS["one rank, one micro-batch"])[0]
    pieces = total_gradient(cfg, batch, SPLITS["micro-batches of one group"])[0]
    assert not torch.allclose(whole, pieces)


def test_step_scope_needs_the_rollout_logprobs():
    batch = step_batch()
    batch = StepBatch(**{**batch.__dict__, "old_logp": None})
    with pytest.raises(ValueError, match="old_logp"):
        prepare_step(config("kl_cov", selection_scope="step"), batch)


def test_step_scope_picks_resume_with_the_seed_and_move_with_the_step():
    """Clip-Cov's random pick is a function of (run seed, step, mini-batch): a resumed step picks the same tokens,
    another step (or seed) other ones."""
    cfg = config("clip_cov", cov_rho=0.05, selection_scope="step")

    def picks(**fields):
        return prepare_step(cfg, step_batch(**fields)).selection

    first = picks(step=3)
    assert torch.equal(first, picks(step=3))
    assert not torch.equal(first, picks(step=4))
    assert not torch.equal(first, picks(seed=12))
    k = max(1, int(0.05 * float(step_batch().mask.sum())))
    assert int(first.sum()) == k


def test_step_scope_mini_batches_pick_their_own_tokens():
    """Each mini-batch (one optimiser update) selects among its own rows: k of its own N, as the reference's batch."""
    cfg = config("kl_cov", cov_rho=0.1, selection_scope="step")
    batch = step_batch(mini_batches=2)
    step = prepare_step(cfg, batch)
    half = GROUPS * G // 2
    for rows in (slice(0, half), slice(half, None)):
        assert int(step.selection[rows].sum()) == max(1, int(0.1 * float(batch.mask[rows].sum())))

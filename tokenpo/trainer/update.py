"""Turn a step's rollouts into advantages and apply the clipped policy update(s) on this rank's share.

The global batch is identical on every rank, so group statistics and loss normalisers are computed on
the whole batch; each rank then back-propagates only its own groups, and every loss term is
(local sum) / (global count), times world size because DeepSpeed averages gradients over ranks.
"""

from __future__ import annotations

from collections import defaultdict

import torch

from tokenpo import algorithms as alg
from tokenpo.deepspeed import dist
from tokenpo.deepspeed.engine import forward_in_engine
from tokenpo.models.logprobs import response_logprobs
from tokenpo.rewards import CORRECT, GOLD_INVALID, format_reward
from tokenpo.trainer.batch import group_micro_batches, pad_groups, pad_to
from tokenpo.trainer.rollouts import StepRollouts


class WeightedMeans:
    """Token-weighted running means of metrics across micro-batches and ranks."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = defaultdict(float)
        self.weights: dict[str, float] = defaultdict(float)

    def add(self, metrics: dict[str, float], weight: float) -> None:
        for key, value in metrics.items():
            self.sums[key] += float(value) * weight
            self.weights[key] += weight

    def reduce(self) -> dict[str, float]:
        sums, weights = defaultdict(float), defaultdict(float)
        for part_sums, part_weights in dist.all_gather_objects((dict(self.sums), dict(self.weights))):
            for key in part_sums:
                sums[key] += part_sums[key]
                weights[key] += part_weights[key]
        return {key: sums[key] / weights[key] for key in sums if weights[key] > 0}


def local_groups(num_groups: int) -> list[int]:
    """Groups this rank trains on (every world_size-th group)."""
    return list(range(dist.rank(), num_groups, dist.world_size()))


def rows_of(groups: list[int], group_size: int) -> list[int]:
    return [g * group_size + j for g in groups for j in range(group_size)]


def group_forward(ctx, model, rollouts: StepRollouts, groups: list[int], *, with_entropy: bool,
                  recompute_head: bool = False):
    """Rows, padded tokens, log-probs [b, T] and entropy of the given groups in one pass."""
    g = rollouts.group_size
    rows = rows_of(groups, g)
    tokens = pad_groups([rollouts.prompt_ids[i] for i in groups], [rollouts.response_ids[i] for i in rows],
                        ctx.tokenizer.pad_token_id, ctx.device)
    logp, entropy = forward_in_engine(
        model, response_logprobs, tokens.prompt_ids, tokens.prompt_mask, tokens.response_ids, tokens.response_mask,
        group_size=g, temperature=ctx.logprob_temperature(), chunk_tokens=ctx.cfg.trainer.logit_chunk_tokens,
        with_entropy=with_entropy, recompute_head=recompute_head)
    return rows, tokens, logp, entropy


def forward_groups(ctx, model, rollouts: StepRollouts, groups: list[int], longest: list[int], *, with_entropy: bool):
    """Per-row log-probs and entropy (dicts of 1-D CPU tensors) of the given groups, in micro-batches."""
    logps, entropies = {}, {}
    for chunk in group_micro_batches(groups, longest, ctx.cfg.trainer.micro_batch_size, rollouts.group_size):
        rows, tokens, logp, entropy = group_forward(ctx, model, rollouts, chunk, with_entropy=with_entropy)
        for k, i in enumerate(rows):
            n = int(tokens.response_mask[k].sum())
            logps[i] = logp[k, :n].cpu()
            if with_entropy:
                entropies[i] = entropy[k, :n].cpu()
    return logps, entropies


def step_tensors(rollouts: StepRollouts, max_new_tokens: int, algorithm_cfg):
    """Global [N] / [N, T] tensors: rewards, correctness, group ids, masks, lengths."""
    g = rollouts.group_size
    n = len(rollouts.response_ids)
    lengths = torch.tensor([len(r) for r in rollouts.response_ids], dtype=torch.long)
    width = max(1, int(lengths.max()))
    mask = (torch.arange(width)[None, :] < lengths[:, None]).float()
    correct = torch.tensor([v == CORRECT for v in rollouts.verdicts])
    valid = torch.tensor([v != GOLD_INVALID for v in rollouts.verdicts])
    truncated = torch.tensor(rollouts.truncated)
    group_ids = torch.arange(n) // g
    rewards, keep, shaping_metrics = alg.shape_rewards(algorithm_cfg, correct, lengths, truncated, group_ids,
                                                       max_new_tokens)
    # a group whose gold answer does not parse is dropped from the loss (and counted by the reward metrics)
    loss_mask = mask * (keep & valid).float()[:, None]
    return dict(lengths=lengths, mask=mask, loss_mask=loss_mask, correct=correct, valid=valid,
                truncated=truncated, group_ids=group_ids, rewards=rewards), shaping_metrics


def format_rewards(rollouts: StepRollouts, reward) -> torch.Tensor:
    """1 where a response gives its answer in the asked-for form (e.g. a boxed number), else 0."""
    require_number = reward.answer_format == "number"
    return torch.tensor([format_reward(text, reward.answer_pattern, require_number=require_number,
                                       reasoning_tag=reward.reasoning_tag)
                         for text in rollouts.response_text])


def train_on_rollouts(ctx, rollouts: StepRollouts, timings) -> dict[str, float]:
    cfg = ctx.cfg
    acfg = cfg.algorithm
    g = rollouts.group_size
    t, metrics = step_tensors(rollouts, cfg.rollout.max_new_tokens, acfg)
    in_format = format_rewards(rollouts, ctx.reward)
    metrics["reward/asked_format_frac"] = float(in_format.mean())
    if ctx.reward.format_weight:
        t["rewards"] = t["rewards"] + ctx.reward.format_weight * in_format
    n, width = t["mask"].shape
    num_groups = len(rollouts.examples)
    longest = t["lengths"].view(num_groups, g).max(1).values.tolist()
    mine = local_groups(num_groups)
    policy = ctx.policy.module
    old_logp = old_entropy = ref_logp = None
    with torch.no_grad():
        if cfg.trainer.mini_batches > 1 or alg.needs_entropy(acfg):
            with timings("old_logprob"):
                old_logp, old_entropy = forward_groups(ctx, policy, rollouts, mine, longest, with_entropy=True)
        if ctx.reference is not None:
            with timings("reference"):
                ref_logp, _ = forward_groups(ctx, ctx.reference, rollouts, mine, longest, with_entropy=False)
    entropy_global = entropy_ref = None
    if old_entropy is not None:
        gathered = {}
        for part in dist.all_gather_objects(old_entropy):
            gathered.update(part)
        entropy_global = pad_to([gathered[i] for i in range(n)], width)
        # the TEPO mask's entropy reference is taken over the whole step batch, whatever the split
        entropy_ref = alg.kl_mask_entropy_reference(acfg, entropy_global, t["mask"], t["group_ids"])
    advantages = alg.token_advantages(acfg, t["rewards"], t["correct"], t["group_ids"], t["mask"], entropy_global)

    means = WeightedMeans()
    groups_per_mini = num_groups // cfg.trainer.mini_batches
    loss_total = 0.0
    with timings("update"):
        for lo in range(0, num_groups, groups_per_mini):
            mini = range(lo, lo + groups_per_mini)
            mini_mask = t["loss_mask"][rows_of(list(mini), g)]
            norm = alg.LossNorm(num_tokens=float(mini_mask.sum()), num_seqs=float((mini_mask.sum(1) > 0).sum()),
                                max_len=cfg.rollout.max_new_tokens)
            for chunk in group_micro_batches([i for i in mine if i in mini], longest, cfg.trainer.micro_batch_size, g):
                rows, tokens, logp, entropy = group_forward(ctx, ctx.policy, rollouts, chunk, with_entropy=True,
                                                            recompute_head=cfg.trainer.recompute_head)
                cols = logp.shape[1]
                loss_mask = t["loss_mask"][rows, :cols].to(ctx.device)
                old = pad_to([old_logp[i] for i in rows], cols).to(ctx.device) if old_logp else logp.detach()
                old_ent = entropy_ref[rows, :cols].to(ctx.device) if entropy_ref is not None else entropy
                ref = pad_to([ref_logp[i] for i in rows], cols).to(ctx.device) if ref_logp else None
                loss, loss_metrics = alg.policy_loss(
                    acfg, logp, old, advantages[rows, :cols].to(ctx.device), loss_mask, norm,
                    ref_logp=ref, entropy=entropy, old_entropy=old_ent)
                # DeepSpeed averages gradients over ranks; each loss is already a share of the global mean
                ctx.policy.backward(loss * dist.world_size(), scale_wrt_gas=False)
                loss_total += float(loss.detach())
                real = tokens.response_mask
                means.add(loss_metrics, float(loss_mask.sum()))
                means.add({"entropy/mean": float((entropy * real).sum() / real.sum().clamp(min=1))}, float(real.sum()))
                means.add(alg.entropy_by_polarity(entropy, real, t["correct"][rows].to(ctx.device)), float(real.sum()))
            ctx.policy.step()
    metrics.update(means.reduce())
    metrics.update(rollout_metrics(rollouts, t, advantages))
    metrics["loss"] = sum(dist.all_gather_objects(loss_total)) / cfg.trainer.mini_batches
    metrics["grad_norm"] = float(ctx.policy.get_global_grad_norm() or 0.0)
    metrics["lr"] = float(ctx.policy.get_lr()[0])
    return metrics


def rollout_metrics(rollouts: StepRollouts, t: dict, advantages: torch.Tensor) -> dict[str, float]:
    from tokenpo.rewards import count_verdicts

    valid = t["valid"]
    rewards = t["rewards"][valid]
    lengths = t["lengths"][valid].float()
    g = rollouts.group_size
    per_group = t["correct"].float().view(-1, g)
    zero_variance = (per_group.max(1).values == per_group.min(1).values).float()
    out = count_verdicts(rollouts.verdicts)
    out.update({
        "reward/mean": float(rewards.mean()) if rewards.numel() else 0.0,
        "reward/std": float(rewards.std()) if rewards.numel() > 1 else 0.0,
        "accuracy": float(t["correct"][valid].float().mean()) if valid.any() else 0.0,
        "groups/zero_variance_frac": float(zero_variance.mean()),
        "response_length/mean": float(lengths.mean()) if lengths.numel() else 0.0,
        "response_length/max": float(lengths.max()) if lengths.numel() else 0.0,
        "response_length/truncated_frac": float(t["truncated"].float().mean()),
        "advantage/abs_mean": float((advantages.abs() * t["mask"]).sum() / t["mask"].sum().clamp(min=1)),
    })
    return out

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
from tokenpo.models.logprobs import response_logprobs
from tokenpo.rewards import CORRECT, GOLD_INVALID
from tokenpo.trainer.batch import micro_batches, pad_rows, pad_to
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


def local_rows(num_groups: int, group_size: int) -> list[int]:
    """Sequence rows of the groups this rank trains on (every world_size-th group)."""
    rank, world = dist.rank(), dist.world_size()
    return [g * group_size + j for g in range(rank, num_groups, world) for j in range(group_size)]


def forward_rows(ctx, model, rollouts: StepRollouts, rows: list[int], *, with_entropy: bool):
    """Log-probs and entropy (lists of 1-D tensors, one per row) of the given rows, in micro-batches."""
    g = rollouts.group_size
    lengths = [len(r) for r in rollouts.response_ids]
    logps, entropies = {}, {}
    for chunk in micro_batches(rows, lengths, ctx.cfg.trainer.micro_batch_size):
        tokens = pad_rows([rollouts.prompt_ids[i // g] for i in chunk], [rollouts.response_ids[i] for i in chunk],
                          ctx.tokenizer.pad_token_id, ctx.device)
        logp, entropy = response_logprobs(model, tokens.input_ids, tokens.attention_mask, tokens.response_mask,
                                          temperature=ctx.logprob_temperature(), with_entropy=with_entropy,
                                          chunk_tokens=ctx.cfg.trainer.logit_chunk_tokens)
        for k, i in enumerate(chunk):
            logps[i] = logp[k, : lengths[i]].cpu()
            if with_entropy:
                entropies[i] = entropy[k, : lengths[i]].cpu()
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


def train_on_rollouts(ctx, rollouts: StepRollouts, timings) -> dict[str, float]:
    cfg = ctx.cfg
    acfg = cfg.algorithm
    g = rollouts.group_size
    t, metrics = step_tensors(rollouts, cfg.rollout.max_new_tokens, acfg)
    n, width = t["mask"].shape
    mine = local_rows(len(rollouts.examples), g)
    policy = ctx.policy.module
    on_policy = cfg.trainer.mini_batches == 1
    old_logp = old_entropy = ref_logp = None
    with torch.no_grad():
        if not on_policy or alg.needs_entropy(acfg):
            with timings("old_logprob"):
                old_logp, old_entropy = forward_rows(ctx, policy, rollouts, mine, with_entropy=True)
        if ctx.reference is not None:
            with timings("reference"):
                ref_logp, _ = forward_rows(ctx, ctx.reference, rollouts, mine, with_entropy=False)
    entropy_global = None
    if old_entropy is not None:
        gathered = {}
        for part in dist.all_gather_objects(old_entropy):
            gathered.update(part)
        entropy_global = pad_to([gathered[i] for i in range(n)], width)
    advantages = alg.token_advantages(acfg, t["rewards"], t["correct"], t["group_ids"], t["mask"], entropy_global)

    means = WeightedMeans()
    lengths = t["lengths"].tolist()
    num_groups = len(rollouts.examples)
    groups_per_mini = -(-num_groups // cfg.trainer.mini_batches)
    loss_total = 0.0
    with timings("update"):
        for lo in range(0, num_groups, groups_per_mini):
            mini_global = range(lo * g, min(num_groups, lo + groups_per_mini) * g)
            mini_mask = t["loss_mask"][list(mini_global)]
            norm = alg.LossNorm(num_tokens=float(mini_mask.sum()), num_seqs=float((mini_mask.sum(1) > 0).sum()),
                                max_len=cfg.rollout.max_new_tokens)
            mini_local = [i for i in mine if i in mini_global]
            for chunk in micro_batches(mini_local, lengths, cfg.trainer.micro_batch_size):
                tokens = pad_rows([rollouts.prompt_ids[i // g] for i in chunk],
                                  [rollouts.response_ids[i] for i in chunk], ctx.tokenizer.pad_token_id, ctx.device)
                logp, entropy = response_logprobs(
                    ctx.policy, tokens.input_ids, tokens.attention_mask, tokens.response_mask,
                    temperature=ctx.logprob_temperature(), chunk_tokens=cfg.trainer.logit_chunk_tokens,
                    recompute_head=cfg.trainer.recompute_head)
                cols = logp.shape[1]
                loss_mask = t["loss_mask"][chunk, :cols].to(ctx.device)
                old = pad_to([old_logp[i] for i in chunk], cols).to(ctx.device) if old_logp else logp.detach()
                old_ent = pad_to([old_entropy[i] for i in chunk], cols).to(ctx.device) if old_entropy else entropy
                ref = pad_to([ref_logp[i] for i in chunk], cols).to(ctx.device) if ref_logp else None
                loss, loss_metrics = alg.policy_loss(
                    acfg, logp, old, advantages[chunk, :cols].to(ctx.device), loss_mask, norm,
                    ref_logp=ref, entropy=entropy, old_entropy=old_ent)
                ctx.policy.backward(loss * dist.world_size(), scale_wrt_gas=False)
                loss_total += float(loss.detach())
                tokens_here = float(tokens.response_mask.sum())
                means.add(loss_metrics, float(loss_mask.sum()))
                means.add({"entropy/mean": float((entropy * tokens.response_mask).sum()) / max(tokens_here, 1.0)},
                          tokens_here)
                means.add(alg.entropy_by_polarity(entropy, tokens.response_mask, t["correct"][chunk].to(ctx.device)),
                          tokens_here)
            ctx.policy.step()
    metrics.update(means.reduce())
    loss_total = sum(dist.all_gather_objects(loss_total)) / cfg.trainer.mini_batches
    metrics.update(rollout_metrics(rollouts, t, advantages))
    metrics["loss"] = loss_total
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
        "dynamic_sampling/rounds": float(rollouts.rounds),
        "dynamic_sampling/filtered_frac": 1.0 - rollouts.mixed_groups / max(1, rollouts.generated_groups),
    })
    return out

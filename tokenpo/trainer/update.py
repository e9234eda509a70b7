"""Turn a step's rollouts into advantages and apply the clipped policy update(s) on this rank's share.

The global batch is identical on every rank, so `alg.prepare_step` computes group statistics and loss
normalisers on the whole batch; each rank then back-propagates only its own groups through
`alg.micro_batch_loss`, and every loss term is (local sum) / (global count), times world size because
DeepSpeed averages gradients over ranks. Nothing here depends on the algorithm: it fills an `alg.StepBatch`
and computes what the registry traits ask for (old entropy, reference log-probs, entropy with grad).
"""

from __future__ import annotations

from collections import defaultdict

import torch

from tokenpo import algorithms as alg
from tokenpo.deepspeed import dist
from tokenpo.deepspeed.engine import forward_in_engine
from tokenpo.models.logprobs import response_logprobs
from tokenpo.models.modes import no_dropout
from tokenpo.rewards import CORRECT, GOLD_INVALID, format_reward
from tokenpo.trainer.batch import MicroBatch, group_micro_batches, pad_groups, pad_to
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


def group_forward(ctx, model, rollouts: StepRollouts, micro: MicroBatch, *, with_entropy: bool,
                  entropy_grad: bool = False, recompute_head: bool = False):
    """Rows, padded tokens, log-probs [b, T] and entropy of one micro-batch's rows in one pass (each of its
    prompts once, for its rows of the micro-batch)."""
    rows = micro.rows
    tokens = pad_groups([rollouts.prompt_ids[i] for i in micro.groups], [rollouts.response_ids[i] for i in rows],
                        ctx.tokenizer.pad_token_id, ctx.device)
    logp, entropy = forward_in_engine(
        model, response_logprobs, tokens.prompt_ids, tokens.prompt_mask, tokens.response_ids, tokens.response_mask,
        group_size=micro.rows_per_prompt, temperature=ctx.logprob_temperature(), chunk_tokens=ctx.cfg.trainer.logit_chunk_tokens,
        with_entropy=with_entropy, entropy_grad=entropy_grad, recompute_head=recompute_head)
    return rows, tokens, logp, entropy


def forward_groups(ctx, model, rollouts: StepRollouts, groups: list[int], longest: list[int], *, with_entropy: bool):
    """Per-row log-probs and entropy (dicts of 1-D CPU tensors) of the given groups, in micro-batches."""
    logps, entropies = {}, {}
    for micro in group_micro_batches(groups, longest, ctx.cfg.trainer.micro_batch_size, rollouts.group_size):
        rows, tokens, logp, entropy = group_forward(ctx, model, rollouts, micro, with_entropy=with_entropy)
        for k, i in enumerate(rows):
            n = int(tokens.response_mask[k].sum())
            logps[i] = logp[k, :n].cpu()
            if with_entropy:
                entropies[i] = entropy[k, :n].cpu()
    return logps, entropies


def step_batch(ctx, rollouts: StepRollouts, old_entropy: torch.Tensor | None) -> alg.StepBatch:
    """The algorithm's view of the step's global batch; `old_entropy` [N, T] when it was computed."""
    lengths = torch.tensor([len(r) for r in rollouts.response_ids], dtype=torch.long)
    return alg.StepBatch(
        correct=torch.tensor([v == CORRECT for v in rollouts.verdicts]),
        valid=torch.tensor([v != GOLD_INVALID for v in rollouts.verdicts]),
        truncated=torch.tensor(rollouts.truncated),
        in_format=format_rewards(rollouts, ctx.reward),
        lengths=lengths,
        group_ids=torch.arange(len(lengths)) // rollouts.group_size,
        mask=alg.response_mask(lengths),
        max_new_tokens=ctx.cfg.rollout.max_new_tokens,
        mini_batches=ctx.cfg.trainer.mini_batches,
        format_weight=ctx.reward.format_weight,
        old_entropy=old_entropy,
    )


def gather_rows(local_rows: dict[int, torch.Tensor], num_rows: int, width: int) -> torch.Tensor:
    """[num_rows, width] from every rank's per-row 1-D tensors, right-padded with zeros."""
    gathered = {}
    for part in dist.all_gather_objects(local_rows):
        gathered.update(part)
    return pad_to([gathered[i] for i in range(num_rows)], width)


def format_rewards(rollouts: StepRollouts, reward) -> torch.Tensor:
    """1 where a response gives its answer in the asked-for form (e.g. a boxed number), else 0."""
    require_number = reward.answer_format == "number"
    return torch.tensor([format_reward(text, reward.answer_pattern, require_number=require_number,
                                       reasoning_tag=reward.reasoning_tag)
                         for text in rollouts.response_text])


def needs_old_logprobs(cfg) -> bool:
    """Whether a step runs the old policy without grad first: several updates per rollout (their ratio's
    denominator) or an algorithm that reads the old policy's entropy."""
    return cfg.trainer.mini_batches > 1 or alg.needs_entropy(cfg.algorithm)


def train_on_rollouts(ctx, rollouts: StepRollouts, timings) -> dict[str, float]:
    cfg = ctx.cfg
    acfg = cfg.algorithm
    g = rollouts.group_size
    num_groups = len(rollouts.examples)
    lengths = [len(r) for r in rollouts.response_ids]
    longest = [max(lengths[i * g : (i + 1) * g]) for i in range(num_groups)]
    mine = local_groups(num_groups)
    policy = ctx.policy.module
    old_logp = old_entropy = ref_logp = None
    with torch.no_grad(), no_dropout(policy):
        if needs_old_logprobs(cfg):
            with timings("old_logprob"):
                old_logp, old_entropy = forward_groups(ctx, policy, rollouts, mine, longest, with_entropy=True)
        if alg.needs_reference(acfg):
            with timings("reference"), ctx.reference_model() as reference:
                ref_logp, _ = forward_groups(ctx, reference, rollouts, mine, longest, with_entropy=False)
    width = max(1, max(lengths))  # of the step's [N, T] tensors
    batch = step_batch(ctx, rollouts, None if old_entropy is None else gather_rows(old_entropy, len(lengths), width))
    step = alg.prepare_step(acfg, batch)
    rollouts.rewards = step.rewards.tolist()  # for the samples table (tokenpo.logger.samples)
    metrics = dict(step.metrics)

    means = WeightedMeans()
    groups_per_mini = num_groups // cfg.trainer.mini_batches
    loss_total = 0.0
    with timings("update"):
        for mini_batch, lo in enumerate(range(0, num_groups, groups_per_mini)):
            mini = range(lo, lo + groups_per_mini)
            for micro in group_micro_batches([i for i in mine if i in mini], longest, cfg.trainer.micro_batch_size, g):
                rows, tokens, logp, entropy = group_forward(ctx, ctx.policy, rollouts, micro, with_entropy=True,
                                                            entropy_grad=alg.needs_entropy_grad(acfg),
                                                            recompute_head=cfg.trainer.recompute_head)
                cols = logp.shape[1]
                old = pad_to([old_logp[i] for i in rows], cols).to(ctx.device) if old_logp is not None else None
                ref = pad_to([ref_logp[i] for i in rows], cols).to(ctx.device) if ref_logp is not None else None
                sampler = (pad_to([torch.tensor(rollouts.sampler_logprobs[i]) for i in rows], cols).to(ctx.device)
                           if rollouts.sampler_logprobs else None)
                loss, loss_metrics = alg.micro_batch_loss(acfg, step, rows, mini_batch, logp, entropy,
                                                          old_logp=old, ref_logp=ref, sampler_logp=sampler)
                # DeepSpeed averages gradients over ranks; each loss is already a share of the global mean
                ctx.policy.backward(loss * dist.world_size(), scale_wrt_gas=False)
                loss_total += float(loss.detach())
                real, entropy = tokens.response_mask, entropy.detach()
                means.add(loss_metrics, float(step.loss_mask[rows, :cols].sum()))
                means.add({"entropy/mean": float((entropy * real).sum() / real.sum().clamp(min=1))}, float(real.sum()))
                means.add(alg.entropy_by_polarity(entropy, real, batch.correct[rows].to(ctx.device)), float(real.sum()))
            ctx.policy.step()
    metrics.update(means.reduce())
    metrics.update(rollout_metrics(rollouts, batch, step))
    metrics["loss"] = sum(dist.all_gather_objects(loss_total)) / cfg.trainer.mini_batches
    metrics["grad_norm"] = float(ctx.policy.get_global_grad_norm() or 0.0)
    metrics["lr"] = float(ctx.policy.get_lr()[0])
    return metrics


def rollout_metrics(rollouts: StepRollouts, batch: alg.StepBatch, step: alg.StepTensors) -> dict[str, float]:
    from tokenpo.rewards import count_verdicts

    valid = batch.valid
    rewards = step.rewards[valid]
    lengths = batch.lengths[valid].float()
    g = rollouts.group_size
    per_group = batch.correct.float().view(-1, g)
    zero_variance = (per_group.max(1).values == per_group.min(1).values).float()
    out = count_verdicts(rollouts.verdicts)
    out.update({
        "reward/mean": float(rewards.mean()) if rewards.numel() else 0.0,
        "reward/std": float(rewards.std()) if rewards.numel() > 1 else 0.0,
        "accuracy": float(batch.correct[valid].float().mean()) if valid.any() else 0.0,
        "groups/zero_variance_frac": float(zero_variance.mean()),
        "response_length/mean": float(lengths.mean()) if lengths.numel() else 0.0,
        "response_length/max": float(lengths.max()) if lengths.numel() else 0.0,
        "response_length/truncated_frac": float(batch.truncated.float().mean()),
        "advantage/abs_mean": float((step.advantages.abs() * batch.mask).sum() / batch.mask.sum().clamp(min=1)),
    })
    return out

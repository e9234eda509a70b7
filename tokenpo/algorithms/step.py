"""The two calls the trainer makes: `prepare_step` once per step on the global batch, `micro_batch_loss` per
micro-batch.

The trainer fills a `StepBatch` (what it knows of the step's responses) and gets back `StepTensors`
(everything the algorithm derives from it). An estimator that needs another per-step input adds a field to
`StepBatch`, filled by the trainer, instead of a branch in the trainer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from tokenpo.algorithms.advantages import token_advantages
from tokenpo.algorithms.aggregation import LossNorm
from tokenpo.algorithms.kl import kl_mask_entropy_reference
from tokenpo.algorithms.losses import policy_loss
from tokenpo.algorithms.selection import entropy_top_mask, selection_generator
from tokenpo.algorithms.shaping import shape_rewards
from tokenpo.algorithms.surrogates import SURROGATES, SelectionInputs

if TYPE_CHECKING:
    from tokenpo.algorithms.config import AlgorithmConfig


@dataclass(frozen=True)
class StepBatch:
    """The step's global batch, group-major (G rows per group): [N] per response, [N, T] per token."""

    correct: Tensor  # [N] bool: the answer matches the gold one
    valid: Tensor  # [N] bool: the gold answer parses (a group without one stays out of the loss)
    truncated: Tensor  # [N] bool: stopped by max_new_tokens
    in_format: Tensor  # [N] float: 1 where the answer is given in the asked-for form
    lengths: Tensor  # [N] long: response tokens
    group_ids: Tensor  # [N] long: responses to one prompt share an id
    mask: Tensor  # [N, T] float: 1 on real response tokens (`response_mask(lengths)`)
    max_new_tokens: int  # L_max of the rollout
    mini_batches: int  # optimiser updates per step, over consecutive equal shares of the groups
    format_weight: float = 0.0  # reward added per in-format answer (reward.format_weight)
    old_entropy: Tensor | None = None  # [N, T] the rollout policy's token entropy; given when needs_entropy
    entropy_coef: float | None = None  # the entropy bonus's coefficient this step (None: algorithm.loss.entropy_coef)
    old_logp: Tensor | None = None  # [N, T] the rollout policy's log-probs; given when needs_step_logprobs
    seed: int = 0  # the run's seed and the step: with them a token selection's random draws resume exactly
    step: int = 0
    # [N] float: each response's score S, reward.functions' weighted sum (tokenpo.rewards.weighted); the sequence reward
    # is then reward.wrong + (reward.correct - reward.wrong)·S. None: `correct` alone (S = 1 or 0)
    score: Tensor | None = None


@dataclass(frozen=True)
class StepTensors:
    """What `prepare_step` derives from a `StepBatch`."""

    rewards: Tensor  # [N] shaped sequence rewards, format bonus included
    loss_mask: Tensor  # [N, T] mask without the responses shaping drops and the groups whose gold is invalid
    advantages: Tensor  # [N, T], 0 on padding
    entropy_reference: Tensor | None  # [N, T] what a KL mask compares the current entropy with
    loss_norms: tuple[LossNorm, ...]  # the global denominators of each mini-batch
    metrics: dict[str, float]  # reward shaping's metrics
    entropy_coef: float  # the entropy bonus's coefficient this step (fixed, or adaptive entropy control's)
    # selection_scope step: [N, T] bool picks of a selecting surrogate and of the 80/20 mask, each mini-batch's own
    selection: Tensor | None = None
    entropy_keep: Tensor | None = None
    seed_parts: tuple[int, ...] = (0, 0)  # (run seed, step): seed a micro-batch's own random pick


def response_mask(lengths: Tensor) -> Tensor:
    """[N] response lengths -> [N, T] float mask, T the longest length (at least 1)."""
    width = max(1, int(lengths.max()))
    return (torch.arange(width)[None, :] < lengths[:, None]).float()


def mini_batch_norms(loss_mask: Tensor, mini_batches: int, max_len: int) -> tuple[LossNorm, ...]:
    """`LossNorm` of each of `mini_batches` consecutive equal shares of the rows."""
    if len(loss_mask) % mini_batches:
        raise ValueError(f"{len(loss_mask)} rows do not split into {mini_batches} equal mini-batches")
    return tuple(LossNorm.from_mask(part, max_len) for part in loss_mask.split(len(loss_mask) // mini_batches))


def prepare_step(cfg: AlgorithmConfig, batch: StepBatch) -> StepTensors:
    """Rewards (shaping and the format bonus), loss mask, advantages, the KL mask's entropy reference and the
    loss normalisers of one step, all on the whole step batch (group and batch statistics see every response)."""
    rewards, keep, metrics = shape_rewards(cfg, batch.correct, batch.lengths, batch.truncated, batch.group_ids,
                                           batch.max_new_tokens, batch.score)
    metrics["reward/asked_format_frac"] = float(batch.in_format.mean())
    if batch.format_weight:
        rewards = rewards + batch.format_weight * batch.in_format
    loss_mask = batch.mask * (keep & batch.valid).float()[:, None]
    entropy_reference = None
    if batch.old_entropy is not None:
        entropy_reference = kl_mask_entropy_reference(cfg, batch.old_entropy, batch.mask, batch.group_ids)
    advantages = token_advantages(cfg, rewards, batch.correct, batch.group_ids, batch.mask, batch.old_entropy)
    norms = mini_batch_norms(loss_mask, batch.mini_batches, batch.max_new_tokens)
    entropy_coef = cfg.loss.entropy_coef if batch.entropy_coef is None else batch.entropy_coef
    selection, entropy_keep = step_selections(cfg, batch, loss_mask, advantages, metrics)
    return StepTensors(rewards, loss_mask, advantages, entropy_reference, norms, metrics, entropy_coef, selection,
                       entropy_keep, (batch.seed, batch.step))


def step_selections(cfg: AlgorithmConfig, batch: StepBatch, loss_mask: Tensor, advantages: Tensor,
                    metrics: dict[str, float]) -> tuple[Tensor | None, Tensor | None]:
    """At `loss.selection_scope: step`, the [N, T] bool picks of the selecting surrogate and of the 80/20 mask, each
    over one mini-batch's rows of every rank (the batch the reference code's micro-batch stands for), from the rollout
    policy's log-probs and entropy: the same tokens however the rows are split into micro-batches and ranks. The
    first update of a step sees that policy; later mini-batches keep its picks where the reference re-selects with the
    current log-probs (docs/algorithms.md). (None, None) at micro_batch scope: `policy_loss` picks per micro-batch."""
    loss = cfg.loss
    if loss.selection_scope != "step":
        return None, None
    parts = [slice(start, start + len(loss_mask) // batch.mini_batches)
             for start in range(0, len(loss_mask), len(loss_mask) // batch.mini_batches)]
    selection = entropy_keep = None
    select = SURROGATES.trait(loss.surrogate, "select")
    if select is not None:
        if batch.old_logp is None:
            raise ValueError(f"surrogate {loss.surrogate!r} at selection_scope step needs StepBatch.old_logp; got None")
        selection = torch.cat([
            select(SelectionInputs(advantages[rows], batch.old_logp[rows], torch.ones_like(batch.old_logp[rows]),
                                   loss_mask[rows], loss, selection_generator(batch.seed, batch.step, mini_batch)))
            for mini_batch, rows in enumerate(parts)])
    if loss.entropy_top_frac is not None:
        if batch.old_entropy is None:
            raise ValueError("algorithm.loss.entropy_top_frac at selection_scope step needs StepBatch.old_entropy")
        masks, thresholds = zip(*(entropy_top_mask(batch.old_entropy[rows], loss_mask[rows], loss.entropy_top_frac)
                                  for rows in parts))
        entropy_keep = torch.cat(masks)
        metrics["entropy_top/threshold"] = float(torch.stack(thresholds).mean())
    return selection, entropy_keep


def micro_batch_loss(
    cfg: AlgorithmConfig,
    step: StepTensors,
    rows: list[int],
    mini_batch: int,
    logp: Tensor,
    entropy: Tensor,
    *,
    old_logp: Tensor | None = None,
    ref_logp: Tensor | None = None,
    sampler_logp: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """Scalar loss of the step's rows `rows` in mini-batch `mini_batch` (its share of that update) and metrics.

    logp, entropy: [b, T'] of the current policy on those rows (logp with grad; entropy with grad when
    `needs_entropy_grad`); old_logp (None: on-policy, the detached logp), ref_logp and sampler_logp (the rollout
    engine's, where it returns them): [b, T'].
    """
    cols = logp.shape[1]

    def these_rows(values: Tensor | None) -> Tensor | None:
        return None if values is None else values[rows, :cols].to(logp.device)

    return policy_loss(cfg, logp, logp.detach() if old_logp is None else old_logp, these_rows(step.advantages),
                       these_rows(step.loss_mask), step.loss_norms[mini_batch], ref_logp=ref_logp, entropy=entropy,
                       entropy_reference=these_rows(step.entropy_reference), sampler_logp=sampler_logp,
                       entropy_coef=step.entropy_coef,
                       selection=these_rows(step.selection), entropy_keep=these_rows(step.entropy_keep),
                       # a micro-batch's own random pick (selection_scope micro_batch): its first row names it
                       generator=selection_generator(*step.seed_parts, mini_batch, min(rows)))

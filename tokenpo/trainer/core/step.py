"""One RL step, read top to bottom: prompts -> G responses each, scored -> the algorithm's advantages and loss
normalisers on the whole batch -> the clipped policy update(s) on this rank's share -> the step's metrics.

`train_step` is the step; `collect_rollouts` and `update_policy` are its two halves, in the order it calls them.
The global batch is identical on every rank, so `alg.prepare_step` computes group statistics and loss normalisers
on all of it; each rank then back-propagates only its own groups through `alg.micro_batch_loss`, and every loss
term is (local sum) / (global count) (`Policy.backward` scales by the world size: DeepSpeed averages over ranks).
Nothing here depends on the algorithm's name: it fills an `alg.StepBatch` and runs the passes the registry's traits
ask for (old log-probs and entropy, reference log-probs, entropy with grad). Shapes: N sequences of the step (G per
group, group-major), T the longest response; a micro-batch's `rows` index into N.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import torch

from tokenpo import algorithms as alg
from tokenpo.algorithms.config import AlgorithmConfig, DynamicSamplingConfig
from tokenpo.algorithms.entropy_control import EntropyCoef
from tokenpo.deepspeed import dist
from tokenpo.errors import ConfigError
from tokenpo.rewards import RewardConfig
from tokenpo.models.logprobs import PassTokens
from tokenpo.trainer.core.batch import BatchSplit, MicroBatch, RolloutBatch, SamplingCounts, UpdatePlan, pad_to
from tokenpo.trainer.core.policy import Policy
from tokenpo.trainer.core.scores import drawn_metrics
from tokenpo.trainer.core.source import RolloutSource
from tokenpo.trainer.core.rollouts import (StepRollouts, counted, dynamic_sampling_metrics, fill_batch, mixed_group_ids,
                                      rollout_batch, rollout_metrics)
from tokenpo.trainer.core.timings import Timings

if TYPE_CHECKING:
    from tokenpo.config import TrainConfig


@dataclass(frozen=True)
class StepSettings:
    """What a step reads of the run's config (`from_config`), named once."""

    algorithm: AlgorithmConfig  # the registry reads its traits and hyperparameters
    reward: RewardConfig  # how training answers are judged: the format reward's pattern and weight
    prompts_per_step: int  # groups in the step's batch
    max_new_tokens: int  # the response cap (overlong shaping reads it)
    micro_batch_size: int  # sequences per forward/backward pass (without a token budget)
    mini_batches: int  # optimizer updates per step, each on a slice of the groups
    pad_token_id: int
    seed: int = 0  # the run's seed: with the step it seeds a token selection's random draws
    micro_batch_tokens: int | None = None  # prompt + response tokens per pass (None: by micro_batch_size)
    balance_ranks: str = "tokens"  # how groups go to ranks: tokens | round_robin
    behaviour_is_old: bool = False  # ahead, not decoupled: the sampler's log-probs are the old policy's
    pack_sequences: bool = False  # passes without padding: a token budget counts the rows' own tokens

    @classmethod
    def from_config(cls, cfg: TrainConfig, pad_token_id: int) -> StepSettings:
        return cls(cfg.algorithm, cfg.reward_for(cfg.data), cfg.data.prompts_per_step, cfg.rollout.max_new_tokens,
                   cfg.trainer.micro_batch_size, cfg.trainer.mini_batches, pad_token_id, cfg.seed,
                   cfg.trainer.micro_batch_tokens, cfg.trainer.balance_ranks,
                   cfg.rollout.async_.max_staleness > 0 and not cfg.rollout.async_.decoupled,
                   cfg.trainer.pack_sequences)

    def split(self, group_size: int) -> BatchSplit:
        """How a step of groups of `group_size` rows splits into passes."""
        return BatchSplit(group_size, self.micro_batch_size, self.micro_batch_tokens, self.balance_ranks,
                          self.pack_sequences)

    @property
    def needs_old_logprobs(self) -> bool:
        """Whether a step runs the old policy without grad first: several updates per rollout (their ratio's
        denominator), an algorithm that reads the old policy's entropy, or a step-wide token selection. Rollouts
        sampled ahead need no pass of their own: with one update per step the proximal policy (the trainer's at the
        start of the update) is the policy of the update's own forward pass (its detached log-probs), and with
        several the pass is run anyway; without the decoupled objective the sampler's log-probs are the old
        policy's."""
        reads_pass = alg.needs_entropy(self.algorithm) or alg.needs_step_logprobs(self.algorithm)
        if self.behaviour_is_old:
            return reads_pass
        return self.mini_batches > 1 or reads_pass


class StepCheck(Protocol):
    """What checks a step before the generator takes its weights (the harness's health monitor): the step's health
    metrics from its `metrics`, the update the policy holds for it committed or skipped."""

    def check(self, step: int, metrics: dict, policy: Policy) -> dict[str, float]: ...


@dataclass(frozen=True)
class StepResult:
    """What one step produced: its metrics (update, rollouts, dynamic sampling, timing), its batch and the shaped
    rewards the update gave it, and the entropy coefficient's state the next step starts from."""

    metrics: dict[str, float]
    rollouts: RolloutBatch  # the step's batch (the samples table reads it)
    rewards: list[float] | None  # each sequence's shaped reward (None: no update this step)
    entropy_coef: EntropyCoef  # for the next step (adaptive entropy control's c and gate; the run state keeps it)

    @property
    def generated_tokens(self) -> int:
        """Response tokens generated in the step, every dynamic-sampling round's included."""
        return self.rollouts.counts.generated_tokens


@dataclass(frozen=True)
class PolicyUpdate:
    """What `update_policy` produced: the step's update and rollout metrics (the same on every rank), and each
    sequence's shaped reward, format bonus included (for the samples table)."""

    metrics: dict[str, float]
    rewards: list[float]


def train_step(step: int, lr: float, run: StepSettings, policy: Policy, source: RolloutSource,
               entropy_coef: EntropyCoef | None, health: StepCheck | None = None) -> StepResult:
    """Rollout step `step` at learning rate `lr`: collect the batch, update the policy on it, publish the new version
    to the generator.
    `entropy_coef`: the entropy coefficient's state the previous step left (None: the run's first step); `health`:
    the run's detectors (trainer.health), which check the step before the generator takes its weights."""
    timings, started = Timings(), time.perf_counter()
    coef = alg.step_entropy_coef(run.algorithm.loss, entropy_coef)
    rollouts = collect_rollouts(step, source, run.prompts_per_step, run.algorithm.dynamic_sampling, run.reward,
                                dist.world_size() * run.mini_batches, timings)
    policy.set_lr(lr)  # every update of this step at lr(step): the schedule counts rollout steps, not updates
    source.before_update()  # the update gets the memory the generator can release
    # dynamic sampling's keep_partial may leave no group that splits over the ranks: no update this step
    update = update_policy(run, policy, rollouts, timings, step, coef.value) if rollouts.examples else None
    metrics = update.metrics if update is not None else {"lr": lr}
    if health is not None:  # an update it held is applied or skipped here
        metrics.update(health.check(step, metrics, policy))
    metrics["entropy/coef"] = coef.value
    # the controller reads the step's mean token entropy of the update passes (the rollout policy's with one
    # mini-batch); a step without an update measured none and leaves it
    next_coef = alg.next_entropy_coef(run.algorithm.loss, coef, metrics.get("entropy/mean"))
    with timings("weight_sync"):
        source.after_update(step, policy)  # the generator gets this version
    if run.algorithm.dynamic_sampling.enabled:
        metrics.update(dynamic_sampling_metrics(rollouts))
    metrics.update(drawn_metrics(rollouts.counts))
    metrics.update(source.take_metrics())
    step_s = time.perf_counter() - started
    metrics.update({f"timing/{phase}_s": seconds for phase, seconds in timings.seconds.items()})
    metrics["timing/step_s"] = step_s
    metrics.update(cuda_memory_metrics(policy.device))
    metrics["throughput/tokens_per_s"] = int(rollouts.lengths.sum()) / step_s
    # the equal-compute axis of tokenpo.compare: every dynamic-sampling round counts, kept or filtered out
    metrics["tokens/generated"] = float(rollouts.counts.generated_tokens)
    return StepResult(metrics, rollouts, update.rewards if update is not None else None, next_coef)


def collect_rollouts(step: int, source: RolloutSource, needed: int, sampling: DynamicSamplingConfig,
                     reward: RewardConfig, parts: int, timings: Timings) -> RolloutBatch:
    """The step's batch of `needed` (data.prompts_per_step) groups, its format flags judged under `reward`. Under
    DAPO dynamic sampling each of at most `max_gen_batches` rounds draws `prompts_per_round` prompts (verl's
    gen_batch_size) until enough groups are mixed; the first `needed` of them make the batch, and `on_exhausted`
    decides when too few are (keep_partial keeps the most that split over `parts` = ranks x mini-batches)."""
    if not sampling.enabled:
        return rollout_batch(source.draw(step, 0, needed, timings), reward)
    drawn = alg.prompts_per_round(needed, sampling.oversample, dist.world_size())
    mixed, rest = StepRollouts(), StepRollouts()  # rest: the groups the filter dropped, in order
    counts = SamplingCounts()
    for round_index in range(sampling.max_gen_batches):
        fresh = source.draw(step, round_index, drawn, timings)
        counts = counted(counts, fresh)
        keep = set(mixed_group_ids(fresh))
        for i in range(len(fresh.examples)):
            (mixed if i in keep else rest).extend(fresh.group(i))
        if len(mixed.examples) >= needed:
            break
    found = len(mixed.examples)
    if found < needed and sampling.on_exhausted == "error":
        raise ConfigError(
            f"algorithm.dynamic_sampling: step {step} found {found} mixed groups of the {needed} data.prompts_per_step "
            f"asks for in max_gen_batches={sampling.max_gen_batches} rounds of {drawn} prompts; raise "
            f"algorithm.dynamic_sampling.max_gen_batches or .oversample, or set .on_exhausted=fill or keep_partial")
    return fill_batch(mixed, rest, counts, needed, sampling.on_exhausted, parts, reward)


def update_policy(run: StepSettings, policy: Policy, rollouts: RolloutBatch, timings: Timings,
                  step: int = 0, entropy_coef: float | None = None) -> PolicyUpdate:
    """Advantages on the whole batch, then `run.mini_batches` optimizer updates, each rank on its share of the rows
    (`RolloutBatch.plan`); the step's update and rollout metrics (the same on every rank) and shaped rewards. `step`
    seeds a token selection's random draws; `entropy_coef`: the entropy bonus's coefficient this step (None:
    algorithm.loss.entropy_coef)."""
    plan = rollouts.plan(run.split(rollouts.group_size), run.mini_batches, dist.world_size())
    mine = plan.of_rank(dist.rank())  # [mini-batch] -> this rank's micro-batches
    passes = no_grad_passes(run, policy, rollouts, mine, timings)
    batch = step_batch(run, rollouts, passes, step, entropy_coef)
    # shaped rewards [N], advantages [N, T], loss masks and normalisers, the algorithm's metrics
    prepared = alg.prepare_step(run.algorithm, batch)
    metrics = dict(prepared.metrics)
    with timings("update"):
        totals = train_passes(run, policy, rollouts, mine, passes, prepared)
    metrics.update(totals.means.reduce())
    metrics.update(rollout_metrics(rollouts, batch, prepared))
    gathered = dist.all_gather_objects((totals.loss, totals.fed.fed, totals.fed.real))
    metrics["loss"] = sum(total for total, _, _ in gathered) / run.mini_batches
    metrics.update(pass_metrics(plan, sum(f for _, f, _ in gathered), sum(r for _, _, r in gathered)))
    metrics["grad_norm"] = policy.grad_norm()
    metrics["lr"] = policy.lr()
    return PolicyUpdate(metrics, prepared.rewards.tolist())


# --- helpers of the step, in the order it calls them ---

@dataclass(frozen=True)
class RowPasses:
    """The no-grad passes the algorithm asks for, on this rank's rows in the update's micro-batches: {row: [n_row]}
    on the CPU (None: not run)."""

    old_logp: dict[int, torch.Tensor] | None = None
    old_entropy: dict[int, torch.Tensor] | None = None
    ref_logp: dict[int, torch.Tensor] | None = None


def no_grad_passes(run: StepSettings, policy: Policy, rollouts: RolloutBatch, mine: list[list[MicroBatch]],
                   timings: Timings) -> RowPasses:
    """The old policy's log-probs and entropy (or, plain PPO on stale data, the sampler's log-probs as the old
    policy's) and the KL reference's, on this rank's micro-batches `mine`, as the algorithm needs them."""
    old_logp = old_entropy = ref_logp = None
    if run.needs_old_logprobs:
        with timings("old_logprob"):
            old_logp, old_entropy = row_logprobs(run, policy, rollouts, mine, reference=False)
    if run.behaviour_is_old:
        old_logp = {i: rollouts.sampler_logprobs[i, : int(rollouts.lengths[i])] for per_mini in mine
                    for micro in per_mini for i in micro.rows}
    if alg.needs_reference(run.algorithm):
        with timings("reference"):
            ref_logp, _ = row_logprobs(run, policy, rollouts, mine, reference=True)
    return RowPasses(old_logp, old_entropy, ref_logp)


def row_logprobs(run: StepSettings, policy: Policy, rollouts: RolloutBatch, micro_batches: list[list[MicroBatch]],
                 *, reference: bool) -> tuple[dict[int, torch.Tensor], dict[int, torch.Tensor]]:
    """Per-row log-probs and entropy ({row: [n_row]} on the CPU), without grad, in `micro_batches` (per mini-batch:
    the update's): the old policy's (with its entropy), or (`reference`) the KL reference's."""
    logps, entropies = {}, {}
    for micro in (micro for per_mini in micro_batches for micro in per_mini):
        tokens = rollouts.tokens(micro, run.pad_token_id, policy.device)
        if reference:
            logp, entropy = policy.reference_logprobs(tokens), None
        else:
            out = policy.logprobs(tokens, grad=False, with_entropy=True)
            logp, entropy = out.logp, out.entropy
        for k, i in enumerate(micro.rows):
            n = int(tokens.response_mask[k].sum())
            logps[i] = logp[k, :n].cpu()
            if entropy is not None:
                entropies[i] = entropy[k, :n].cpu()
    return logps, entropies


def step_batch(run: StepSettings, rollouts: RolloutBatch, passes: RowPasses, step: int,
               entropy_coef: float | None) -> alg.StepBatch:
    """The algorithm's view of the global batch: [N] per sequence, [N, T] per token; the no-grad passes' rows
    gathered from every rank where the algorithm reads the whole batch's."""
    num_rows, width = rollouts.response_ids.shape  # N, T
    return alg.StepBatch(
        correct=rollouts.correct,
        valid=rollouts.valid,
        truncated=rollouts.truncated,
        in_format=rollouts.in_format,
        lengths=rollouts.lengths,
        group_ids=rollouts.group_ids,
        mask=alg.response_mask(rollouts.lengths),  # [N, T]
        max_new_tokens=run.max_new_tokens,
        mini_batches=run.mini_batches,
        format_weight=run.reward.format_weight,
        # the entropy-weighted estimators normalise over the whole batch
        old_entropy=None if passes.old_entropy is None else gather_rows(passes.old_entropy, num_rows, width),
        entropy_coef=entropy_coef,
        # a step-wide token selection ranks the tokens of the whole batch
        old_logp=gather_rows(passes.old_logp, num_rows, width) if alg.needs_step_logprobs(run.algorithm) else None,
        seed=run.seed,
        step=step,
        score=rollouts.score,
    )


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


@dataclass
class UpdateTotals:
    """What this rank's update passes add up: token-weighted metric means, the loss, the tokens fed."""

    means: WeightedMeans = field(default_factory=WeightedMeans)
    loss: float = 0.0
    fed: PassTokens = field(default_factory=PassTokens)


def train_passes(run: StepSettings, policy: Policy, rollouts: RolloutBatch, mine: list[list[MicroBatch]],
                 passes: RowPasses, prepared: alg.StepTensors) -> UpdateTotals:
    """The updates: mini-batch k trains groups [k * n, (k + 1) * n), n = groups / mini_batches, in this rank's
    micro-batches `mine[k]`, then one optimizer step."""
    totals = UpdateTotals()
    for mini_batch, micro_batches in enumerate(mine):
        for micro in micro_batches:
            train_micro_batch(run, policy, rollouts, micro, mini_batch, passes, prepared, totals)
        policy.step()
    return totals


def train_micro_batch(run: StepSettings, policy: Policy, rollouts: RolloutBatch, micro: MicroBatch, mini_batch: int,
                      passes: RowPasses, prepared: alg.StepTensors, totals: UpdateTotals) -> None:
    """One forward and backward of `micro` (this rank's share of the global mean); its loss, tokens and metrics
    added to `totals`."""
    rows = micro.rows  # [b] indices into N
    tokens = rollouts.tokens(micro, run.pad_token_id, policy.device)
    out = policy.logprobs(tokens, grad=True, with_entropy=True, entropy_grad=alg.needs_entropy_grad(run.algorithm),
                          fed=totals.fed)  # [b, t] each
    cols = out.logp.shape[1]

    def padded(per_row: dict[int, torch.Tensor] | None) -> torch.Tensor | None:  # the rows' [b, t]
        return None if per_row is None else pad_to([per_row[i] for i in rows], cols).to(policy.device)

    # none when the sampler's log-probs are the old policy's: no behaviour term, nothing to compare
    behaviour = rollouts.sampler_logprobs is not None and not run.behaviour_is_old
    loss, loss_metrics = alg.micro_batch_loss(
        run.algorithm, prepared, rows, mini_batch, out.logp, out.entropy, old_logp=padded(passes.old_logp),
        ref_logp=padded(passes.ref_logp),
        sampler_logp=rollouts.sampler_logprobs[rows, :cols].to(policy.device) if behaviour else None)
    policy.backward(loss)
    totals.loss += float(loss.detach())
    real, entropy = tokens.response_mask, out.entropy.detach()  # [b, t]
    totals.means.add(loss_metrics, float(prepared.loss_mask[rows, :cols].sum()))
    totals.means.add({"entropy/mean": float((entropy * real).sum() / real.sum().clamp(min=1))}, float(real.sum()))
    totals.means.add(alg.entropy_by_polarity(entropy, real, rollouts.correct[rows].to(policy.device)),
                     float(real.sum()))


def pass_metrics(plan: UpdatePlan, fed: int, real: int) -> dict[str, float]:
    """The update passes of every rank: their padding (the fraction of the token positions they ran that were
    padding), tokens per pass, passes per rank, and how far the busiest rank's tokens are above the mean."""
    passes = sum(len(per_rank) for per_mini in plan.passes for per_rank in per_mini)
    return {"batch/padding_frac": 1.0 - real / fed if fed else 0.0,
            "batch/tokens_per_micro_batch": fed / passes if passes else 0.0,
            "batch/micro_batches": float(sum(len(per_mini[0]) for per_mini in plan.passes)),
            "batch/rank_imbalance": plan.rank_imbalance}


def gather_rows(local_rows: dict[int, torch.Tensor], num_rows: int, width: int) -> torch.Tensor:
    """[num_rows, width] from every rank's per-row 1-D tensors, right-padded with zeros: one tensor all_gather of
    each rank's rows (and one of their indices), not a pickled dict."""
    indices = sorted(local_rows)
    rows = dist.all_gather_rows(pad_to([local_rows[i] for i in indices], width))
    ids = dist.all_gather_rows(torch.tensor(indices, dtype=torch.long).view(-1, 1))
    out = torch.zeros(num_rows, width, dtype=torch.float32)
    for part, part_ids in zip(rows, ids):
        out[part_ids.view(-1)] = part
    return out




def cuda_memory_metrics(device: torch.device) -> dict[str, float]:
    """Peak CUDA memory so far (the worst-case pass included): what torch's tensors took, and what its caching
    allocator held; none on CPU."""
    if device.type != "cuda":
        return {}
    return {"memory/cuda_peak_allocated_bytes": float(torch.cuda.max_memory_allocated(device)),
            "memory/cuda_peak_reserved_bytes": float(torch.cuda.max_memory_reserved(device))}

"""A step's rollouts: the lists a dynamic-sampling round is drawn as (`StepRollouts`), DAPO's mixed-group filter
and batch fill over them, the step's `RolloutBatch` built once from the kept ones, and its metrics;
tokenpo.trainer.core.source generates and scores them."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from tokenpo import algorithms as alg
from tokenpo.data import Example
from tokenpo.rewards import CORRECT, GOLD_INVALID, RewardConfig, correct_counts, count_verdicts, format_reward
from tokenpo.trainer.core.batch import RolloutBatch, SamplingCounts, pad_to
from tokenpo.trainer.core.scores import response_scores


@dataclass
class StepRollouts:
    """Rollouts as drawn and gathered, identical on every rank: a round's, or the groups collected over rounds;
    sequences are group-major (G rows per group). `rollout_batch` turns the kept ones into the step's batch."""

    examples: list[Example] = field(default_factory=list)
    prompt_ids: list[list[int]] = field(default_factory=list)  # one per group
    response_ids: list[list[int]] = field(default_factory=list)  # one per sequence
    response_text: list[str] = field(default_factory=list)
    truncated: list[bool] = field(default_factory=list)
    verdicts: list[str] = field(default_factory=list)
    # the rollout engine's log-probs of the sampled tokens, one list per sequence; empty where it returns none
    sampler_logprobs: list[list[float]] = field(default_factory=list)
    # each sequence's score (reward.functions' weighted sum; None: out of the loss); empty: the verdicts alone
    scores: list[float | None] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)  # the policy version that sampled each sequence

    @property
    def group_size(self) -> int:
        return len(self.response_ids) // max(1, len(self.examples))

    def group(self, index: int) -> StepRollouts:
        g = self.group_size
        rows = slice(index * g, (index + 1) * g)
        return StepRollouts([self.examples[index]], [self.prompt_ids[index]], self.response_ids[rows],
                            self.response_text[rows], self.truncated[rows], self.verdicts[rows],
                            self.sampler_logprobs[rows], scores=self.scores[rows], versions=self.versions[rows])

    def extend(self, other: StepRollouts) -> None:
        for name in ("examples", "prompt_ids", "response_ids", "response_text", "truncated", "verdicts",
                     "sampler_logprobs", "scores", "versions"):
            getattr(self, name).extend(getattr(other, name))


def counted(counts: SamplingCounts, drawn: StepRollouts) -> SamplingCounts:
    """`counts` with the round `drawn` added: its groups, response tokens and verdicts."""
    correct, judged = correct_counts(drawn.verdicts)
    return replace(counts, rounds=counts.rounds + 1, generated_groups=counts.generated_groups + len(drawn.examples),
                   generated_tokens=counts.generated_tokens + sum(map(len, drawn.response_ids)),
                   drawn_correct=counts.drawn_correct + correct, drawn_judged=counts.drawn_judged + judged)


def token_ids(rows: list[list[int]], right_aligned: bool = False) -> torch.Tensor:
    """[rows, the longest row (at least 1)] long: each row's ids, padded with 0 after it (or before it)."""
    width = max([1, *map(len, rows)])
    out = torch.zeros(len(rows), width, dtype=torch.long)
    for i, row in enumerate(rows):
        start = width - len(row) if right_aligned else 0
        out[i, start : start + len(row)] = torch.tensor(row, dtype=torch.long)
    return out


def rollout_batch(kept: StepRollouts, reward: RewardConfig, counts: SamplingCounts | None = None) -> RolloutBatch:
    """The step's batch of `kept` as tensors: the format flags under `reward`, and dynamic sampling's `counts` (None:
    one round drawn, every group kept)."""
    if counts is None:
        counts = replace(counted(SamplingCounts(), kept), mixed_groups=len(kept.examples))
    lengths = torch.tensor([len(r) for r in kept.response_ids], dtype=torch.long)
    response_ids = token_ids(kept.response_ids)
    valid, score = response_scores(kept.verdicts, kept.scores)
    sampler_logprobs = None
    if kept.sampler_logprobs:
        sampler_logprobs = pad_to([torch.tensor(row) for row in kept.sampler_logprobs], response_ids.shape[1])
    return RolloutBatch(
        examples=list(kept.examples), group_size=kept.group_size, prompt_ids=token_ids(kept.prompt_ids, True),
        prompt_lengths=torch.tensor([len(p) for p in kept.prompt_ids], dtype=torch.long),
        response_ids=response_ids, lengths=lengths,
        group_ids=torch.arange(len(kept.examples)).repeat_interleave(kept.group_size),
        correct=torch.tensor([v == CORRECT for v in kept.verdicts], dtype=torch.bool), valid=valid, score=score,
        truncated=torch.tensor(kept.truncated, dtype=torch.bool), in_format=format_rewards(kept.response_text, reward),
        sampler_logprobs=sampler_logprobs, versions=torch.tensor(kept.versions) if kept.versions else None,
        verdicts=list(kept.verdicts), response_text=list(kept.response_text), counts=counts)


def mixed_group_ids(rollouts: StepRollouts) -> list[int]:
    """Groups with both right and wrong answers (DAPO filters on accuracy) and a gold answer that parses."""
    g = rollouts.group_size
    correct = torch.tensor([v == CORRECT for v in rollouts.verdicts], dtype=torch.float32)
    group_ids = torch.arange(len(rollouts.examples)).repeat_interleave(g)
    mixed = alg.select_mixed_groups(correct, group_ids, len(rollouts.examples))
    return [i for i in mixed if rollouts.verdicts[i * g] != GOLD_INVALID]


def fill_batch(mixed: StepRollouts, rest: StepRollouts, counts: SamplingCounts, needed: int, on_exhausted: str,
               parts: int, reward: RewardConfig) -> RolloutBatch:
    """The step's batch from the mixed groups found (in order) and the dropped ones, over rounds `counts` counted:
    the first `needed` mixed groups; with fewer, `fill` adds dropped groups up to `needed` (all-equal: zero advantage
    under GRPO-style estimators, entropy-only under GTPO) and `keep_partial` keeps the most that split over `parts`
    (= ranks x mini-batches)."""
    found = len(mixed.examples)
    exhausted = found < needed
    kept = alg.partial_batch_size(found, parts) if exhausted and on_exhausted == "keep_partial" else min(found, needed)
    filled = needed - found if exhausted and on_exhausted == "fill" else 0
    batch = StepRollouts()
    for i in range(kept):
        batch.extend(mixed.group(i))
    for i in range(filled):
        batch.extend(rest.group(i))
    return rollout_batch(batch, reward, replace(counts, mixed_groups=found, filled_groups=filled,
                                                 dropped_groups=found - kept, exhausted=exhausted))


def format_rewards(response_text: list[str], reward: RewardConfig) -> torch.Tensor:
    """1 where a response gives its answer in the asked-for form (e.g. a boxed number), else 0."""
    require_number = reward.answer_format == "number"
    return torch.tensor([format_reward(text, reward.answer_pattern, require_number=require_number,
                                       reasoning_tag=reward.reasoning_tag)
                         for text in response_text])


def dynamic_sampling_metrics(rollouts: RolloutBatch) -> dict[str, float]:
    """How the step's batch was collected (logged every step, also when no update ran)."""
    counts = rollouts.counts
    return {
        "dynamic_sampling/rounds": float(counts.rounds),
        "dynamic_sampling/prompts": float(counts.generated_groups),
        "dynamic_sampling/mixed_groups": float(counts.mixed_groups),
        "dynamic_sampling/filled_groups": float(counts.filled_groups),
        "dynamic_sampling/dropped_groups": float(counts.dropped_groups),
        "dynamic_sampling/exhausted": float(counts.exhausted),
        "dynamic_sampling/filtered_frac": 1.0 - counts.mixed_groups / max(1, counts.generated_groups),
        "dynamic_sampling/batch_groups": float(len(rollouts.examples)),
    }


def rollout_metrics(rollouts: RolloutBatch, batch: alg.StepBatch, step: alg.StepTensors) -> dict[str, float]:
    """Rewards, accuracy, lengths and advantages of the step's batch (valid gold answers only)."""
    valid = batch.valid
    rewards = step.rewards[valid]
    lengths = batch.lengths[valid].float()
    per_group = batch.correct.float().view(-1, rollouts.group_size)
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

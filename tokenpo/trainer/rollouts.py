"""A step's rollouts: the batch type and the pure helpers the step reads them with (DAPO's mixed-group filter and
batch fill, format rewards, metrics); tokenpo.trainer.source generates and scores them."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from tokenpo import algorithms as alg
from tokenpo.data import Example
from tokenpo.rewards import CORRECT, GOLD_INVALID, RewardConfig, count_verdicts, format_reward
from tokenpo.trainer.batch import BatchSplit, GroupTokens, MicroBatch, UpdatePlan, pad_groups, update_plan


@dataclass
class StepRollouts:
    """The step's global batch, identical on every rank; sequences are group-major (G rows per group)."""

    examples: list[Example] = field(default_factory=list)
    prompt_ids: list[list[int]] = field(default_factory=list)  # one per group
    response_ids: list[list[int]] = field(default_factory=list)  # one per sequence
    response_text: list[str] = field(default_factory=list)
    truncated: list[bool] = field(default_factory=list)
    verdicts: list[str] = field(default_factory=list)
    # the rollout engine's log-probs of the sampled tokens, one list per sequence; empty where it returns none
    sampler_logprobs: list[list[float]] = field(default_factory=list)
    # dynamic sampling's account of the step (logged as dynamic_sampling/*)
    rounds: int = 0
    generated_groups: int = 0  # groups generated over all rounds
    generated_tokens: int = 0  # response tokens generated over all rounds, kept or filtered out (all ranks)
    mixed_groups: int = 0  # generated groups that passed the filter (all of them without dynamic sampling)
    drawn_correct: int = 0  # responses generated over all rounds, kept or filtered out, judged correct
    drawn_judged: int = 0  # of those responses, the ones whose gold answer parses
    filled_groups: int = 0  # all-equal groups added to reach prompts_per_step (on_exhausted: fill)
    dropped_groups: int = 0  # mixed groups left out: beyond prompts_per_step, or the uneven rest (keep_partial)
    exhausted: bool = False  # max_gen_batches rounds found fewer mixed groups than prompts_per_step
    rewards: list[float] = field(default_factory=list)  # each sequence's shaped reward, set by the step
    # each sequence's score (reward.functions' weighted sum; None: out of the loss); empty: the verdicts alone
    scores: list[float | None] = field(default_factory=list)

    @property
    def group_size(self) -> int:
        return len(self.response_ids) // max(1, len(self.examples))

    def group(self, index: int) -> StepRollouts:
        g = self.group_size
        rows = slice(index * g, (index + 1) * g)
        return StepRollouts([self.examples[index]], [self.prompt_ids[index]], self.response_ids[rows],
                            self.response_text[rows], self.truncated[rows], self.verdicts[rows],
                            self.sampler_logprobs[rows], scores=self.scores[rows])

    def extend(self, other: StepRollouts) -> None:
        for name in ("examples", "prompt_ids", "response_ids", "response_text", "truncated", "verdicts",
                     "sampler_logprobs", "scores"):
            getattr(self, name).extend(getattr(other, name))

    def tokens(self, micro: MicroBatch, pad_id: int, device: torch.device) -> GroupTokens:
        """One micro-batch's tensors: each of its prompts once (left-padded), its rows' responses (right-padded)."""
        return pad_groups([self.prompt_ids[i] for i in micro.groups], [self.response_ids[i] for i in micro.rows],
                          pad_id, device, micro.prompt_index(self.group_size))

    def plan(self, split: BatchSplit, mini_batches: int, world: int) -> UpdatePlan:
        """Which rank trains which rows in which micro-batches (tokenpo.trainer.batch.update_plan)."""
        return update_plan(split, [len(p) for p in self.prompt_ids], [len(r) for r in self.response_ids],
                           mini_batches, world)


def mixed_group_ids(rollouts: StepRollouts) -> list[int]:
    """Groups with both right and wrong answers (DAPO filters on accuracy) and a gold answer that parses."""
    g = rollouts.group_size
    correct = torch.tensor([v == CORRECT for v in rollouts.verdicts], dtype=torch.float32)
    group_ids = torch.arange(len(rollouts.examples)).repeat_interleave(g)
    mixed = alg.select_mixed_groups(correct, group_ids, len(rollouts.examples))
    return [i for i in mixed if rollouts.verdicts[i * g] != GOLD_INVALID]


def fill_batch(mixed: StepRollouts, rest: StepRollouts, needed: int, on_exhausted: str, parts: int) -> StepRollouts:
    """The step's batch from the mixed groups found (in order) and the dropped ones: the first `needed` mixed
    groups; with fewer, `fill` adds dropped groups up to `needed` (all-equal: zero advantage under GRPO-style
    estimators, entropy-only under GTPO) and `keep_partial` keeps the most that split over `parts`
    (= ranks x mini-batches)."""
    found = len(mixed.examples)
    exhausted = found < needed
    kept = alg.partial_batch_size(found, parts) if exhausted and on_exhausted == "keep_partial" else min(found, needed)
    filled = needed - found if exhausted and on_exhausted == "fill" else 0
    batch = StepRollouts(rounds=mixed.rounds, generated_groups=mixed.generated_groups,
                         generated_tokens=mixed.generated_tokens, mixed_groups=found,
                         drawn_correct=mixed.drawn_correct, drawn_judged=mixed.drawn_judged,
                         filled_groups=filled, dropped_groups=found - kept, exhausted=exhausted)
    for i in range(kept):
        batch.extend(mixed.group(i))
    for i in range(filled):
        batch.extend(rest.group(i))
    return batch


def format_rewards(rollouts: StepRollouts, reward: RewardConfig) -> torch.Tensor:
    """1 where a response gives its answer in the asked-for form (e.g. a boxed number), else 0."""
    require_number = reward.answer_format == "number"
    return torch.tensor([format_reward(text, reward.answer_pattern, require_number=require_number,
                                       reasoning_tag=reward.reasoning_tag)
                         for text in rollouts.response_text])


def dynamic_sampling_metrics(rollouts: StepRollouts) -> dict[str, float]:
    """How the step's batch was collected (logged every step, also when no update ran)."""
    return {
        "dynamic_sampling/rounds": float(rollouts.rounds),
        "dynamic_sampling/prompts": float(rollouts.generated_groups),
        "dynamic_sampling/mixed_groups": float(rollouts.mixed_groups),
        "dynamic_sampling/filled_groups": float(rollouts.filled_groups),
        "dynamic_sampling/dropped_groups": float(rollouts.dropped_groups),
        "dynamic_sampling/exhausted": float(rollouts.exhausted),
        "dynamic_sampling/filtered_frac": 1.0 - rollouts.mixed_groups / max(1, rollouts.generated_groups),
        "dynamic_sampling/batch_groups": float(len(rollouts.examples)),
    }


def rollout_metrics(rollouts: StepRollouts, batch: alg.StepBatch, step: alg.StepTensors) -> dict[str, float]:
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

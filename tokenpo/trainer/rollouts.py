"""A step's rollouts: the batch type, the source that generates and scores them (generator + scorer + prompts), and
the pure helpers the step reads them with (DAPO's mixed-group filter and batch fill, format rewards, metrics)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from tokenpo import algorithms as alg
from tokenpo.data import DataConfig, Example
from tokenpo.data.prompts import capped_prompt_ids
from tokenpo.deepspeed import dist
from tokenpo.rewards import (CORRECT, GOLD_INVALID, RewardConfig, RewardScorer, count_verdicts, format_reward,
                             question)
from tokenpo.rollout.config import RolloutConfig
from tokenpo.rollout.engine import Responses, RolloutEngine, SamplingParams, seeded_generator
from tokenpo.trainer.batch import BatchSplit, GroupTokens, MicroBatch, UpdatePlan, pad_groups, update_plan
from tokenpo.trainer.timings import Timings


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


def sampling_params(rollout: RolloutConfig, stop_token_ids: list[int]) -> SamplingParams:
    """How training responses are sampled: G per prompt, up to max_new_tokens, at the rollout's temperature."""
    return SamplingParams(rollout.group_size, rollout.max_new_tokens, rollout.temperature, rollout.top_p,
                          stop_token_ids, rollout.share_prefill)


class PromptCache:
    """Token ids of a training problem under the training data's template and prompt cap, encoded once per run."""

    def __init__(self, tokenizer, data: DataConfig) -> None:
        self.tokenizer, self.data = tokenizer, data
        self.cache: dict[tuple[str, str], list[int]] = {}

    def __call__(self, example: Example) -> list[int]:
        key = (example.uid, example.problem)
        if key not in self.cache:
            self.cache[key] = capped_prompt_ids(example.problem, self.tokenizer, self.data)
        return self.cache[key]


@dataclass
class RolloutSource:
    """Examples in, scored rollouts out: the rollout engine (the Generator), the reward scorer and the prompts."""

    engine: RolloutEngine
    scorer: RewardScorer
    encode: Callable[[Example], list[int]]  # a training prompt's token ids (PromptCache)
    decode: Callable[[list[list[int]]], list[str]]  # responses' text (the tokenizer's batch_decode)
    params: SamplingParams
    seed_base: int  # the run's seed
    device: torch.device

    def seed(self, step: int, round_index: int) -> int:
        """Sampling randomness depends only on (seed, step, round, rank): a resumed run samples the same."""
        return ((self.seed_base * 100_003 + step) * 101 + round_index) * 1009 + dist.rank()

    def generator(self, step: int, round_index: int) -> torch.Generator:
        return seeded_generator(self.seed(step, round_index), self.device)

    def draw(self, step: int, round_index: int, count: int, sampler, timings: Timings) -> StepRollouts:
        """Round `round_index` of step `step`: `count` prompts from `sampler`, generated now by the engine."""
        return self.generate_and_score(sampler.next_batch(count), self.generator(step, round_index), timings)

    def local_prompts(self, examples: list[Example]) -> tuple[list[int], list[list[int]]]:
        """(this rank's groups of `examples`, every world_size-th one; their prompts' token ids)."""
        local = list(range(dist.rank(), len(examples), dist.world_size()))
        return local, [self.encode(examples[i]) for i in local]

    def generate_and_score(self, examples: list[Example], generator: torch.Generator,
                           timings: Timings) -> StepRollouts:
        """Generate for this rank's share of `examples` (every world_size-th group), score, gather all ranks."""
        local, prompt_ids = self.local_prompts(examples)
        out = None
        if local:
            with timings("generate"):
                out = self.engine.generate(prompt_ids, self.params, generator)
        return self.scored(examples, local, prompt_ids, out, timings)

    def scored(self, examples: list[Example], local: list[int], prompt_ids: list[list[int]], out: Responses | None,
               timings: Timings) -> StepRollouts:
        """This rank's responses `out` to its groups `local` of `examples` scored, then every rank's gathered in the
        groups' order."""
        local_rollouts = StepRollouts()
        if local:
            text = self.decode(out.token_ids)
            questions = [question(examples[i]) for i in local for _ in range(self.params.num_samples)]
            with timings("reward"):
                judged = self.scorer.judge(text, questions)
            local_rollouts = StepRollouts([examples[i] for i in local], prompt_ids, out.token_ids, text,
                                          out.truncated, judged.verdicts, out.logprobs or [], scores=judged.scores)
        gathered = dist.all_gather_objects(local_rollouts)
        # back to the original group order: group i was generated by rank i % world
        world = dist.world_size()
        merged = StepRollouts()
        for i in range(len(examples)):
            merged.extend(gathered[i % world].group(i // world))
        return merged

    def after_update(self, step: int, policy) -> None:
        """The update of `step` is applied: nothing to do when generating in turn (the engine syncs in the step)."""

    def take_metrics(self) -> dict[str, float]:
        """What the source measured since the last call (none when generating in turn)."""
        return {}


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

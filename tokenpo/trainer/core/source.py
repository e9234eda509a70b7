"""Where a step's rollouts come from: the source that turns examples into scored rollouts (the prompts, the generator,
the reward scorer) on a schedule of policy versions, the prompts' token ids, and how training responses are
sampled. The source is the same whether the generator answers in turn or runs ahead of the update (rollout.async):
only the `Schedule` and the generator differ."""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

from tokenpo.data import DataConfig, Example, PromptSampler
from tokenpo.data.prompts import capped_prompt_ids
from tokenpo.deepspeed import dist
from tokenpo.rewards import RewardScorer, question
from tokenpo.rollout.config import RolloutConfig
from tokenpo.rollout.engine import SamplingParams
from tokenpo.rollout.generator import GenerateRequest, Generated, Generator, GeneratorDown, agreed, version_for
from tokenpo.trainer.core.rollouts import StepRollouts
from tokenpo.trainer.core.timings import Timings

log = logging.getLogger("tokenpo")


def sampling_params(rollout: RolloutConfig, stop_token_ids: list[int]) -> SamplingParams:
    """How training responses are sampled: G per prompt, up to max_new_tokens, at the rollout's temperature."""
    return SamplingParams(rollout.group_size, rollout.max_new_tokens, rollout.temperature, rollout.top_p,
                          stop_token_ids, rollout.share_prefill)


@dataclass(frozen=True)
class Prompts:
    """The training prompts: drawn from the sampler, encoded (PromptCache), responses decoded (batch_decode)."""

    sampler: PromptSampler
    encode: Callable[[Example], list[int]]
    decode: Callable[[list[list[int]]], list[str]]


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


@dataclass(frozen=True)
class Schedule:
    """When each step's rollouts are sampled: with rollout.async.max_staleness = k >= 1 the first round of step r is
    submitted k steps ahead, sampled by version `version_for(r, k)` (version v: the policy after v updates), so a
    batch's staleness at step r is exactly min(k, r - 1) versions whatever the timing; with k = 0 every round is
    sampled when the step draws it, by the newest version. DAPO's further rounds of a step are sampled when the step
    asks for them, by the newest version."""

    max_staleness: int  # k
    first_round: int  # prompts in a step's first round (data.prompts_per_step, or DAPO's round size)
    max_steps: int

    def ahead_at_start(self, steps_done: int) -> range:
        """The steps whose first round is submitted before step `steps_done + 1` trains: the next k + 1 (up to
        max_steps), none in turn."""
        first = steps_done + 1
        return range(first, min(first + self.max_staleness, self.max_steps) + 1) if self.max_staleness else range(0)

    def ahead_after(self, step: int) -> int | None:
        """The step whose first round is submitted once step `step`'s update is applied: step + k + 1, sampled by
        version `step`; None in turn or past max_steps."""
        ahead = step + self.max_staleness + 1
        return ahead if self.max_staleness and ahead <= self.max_steps else None


class RolloutSource:
    """Examples in, scored rollouts out: the prompt sampler, the generator (tokenpo.rollout.generator), the reward
    scorer; which version samples what (`Schedule`); the rounds in flight at a checkpoint (`state_dict`)."""

    def __init__(self, generator: Generator, scorer: RewardScorer, prompts: Prompts, params: SamplingParams,
                 schedule: Schedule, seed_base: int) -> None:
        self.generator, self.scorer, self.prompts, self.schedule = generator, scorer, prompts, schedule
        # ahead, every batch carries the behaviour policy's log-probs of its tokens (the off-policy correction)
        self.params = replace(params, logprobs=True) if schedule.max_staleness else params
        self.seed_base = seed_base
        self.examples: dict[tuple[int, int], list[Example]] = {}  # each submitted round's prompts (every rank's)
        # a generator that failed to take a version's weights: the step ends, the run saves and stops
        self.down: GeneratorDown | None = None
        self.metrics: dict[str, list[float]] = defaultdict(list)

    def seed(self, step: int, round_index: int) -> int:
        """Sampling randomness depends only on (seed, step, round, rank): a resumed run samples the same."""
        return ((self.seed_base * 100_003 + step) * 101 + round_index) * 1009 + dist.rank()

    # --- the run's calls ---

    def start(self, policy, steps_done: int) -> None:
        """Before the first step to run: the policy as version `steps_done` to the generator, and the first rounds of
        the steps sampled ahead (those a checkpoint brought back excepted). A run resumed past the schedule's end
        (max_steps raised) samples those first rounds by this version: the older ones it would name are gone."""
        agreed(self.generator.load, policy.publish(steps_done))
        k = self.schedule.max_staleness
        for step in self.schedule.ahead_at_start(steps_done):
            version = max(version_for(step, k), steps_done)
            if version != version_for(step, k):
                log.info("step %d: sampled by policy version %d, not %d (the run resumed past its last checkpoint's "
                         "schedule)", step, version, version_for(step, k))
            self.submit(step, 0, self.schedule.first_round, version)

    def draw(self, step: int, round_index: int, count: int, timings: Timings) -> StepRollouts:
        """Round `round_index` of step `step`: the first round as submitted ahead, any other sampled now (`count`
        prompts from the sampler) by the newest version."""
        key = (step, round_index)
        self.submit(step, round_index, count, step - 1)
        with timings("generate"):
            generated, waited = agreed(self.generator.result, key)
        examples = self.examples.pop(key)
        local = self.local_groups(examples)
        rollouts = self.scored(examples, local, generated if local else None, timings)
        if self.schedule.max_staleness:
            self.metrics["async/staleness"].append(step - 1 - generated.version)
            for versions in generated.responses.token_versions or []:
                self.metrics["async/token_staleness"] += [step - 1 - version for version in versions]
                self.metrics["async/partial_frac"].append(float(len(set(versions)) > 1))
            self.metrics["timing/trainer_wait_rollouts_s"].append(waited)
            self.metrics["timing/generator_wait_weights_s"].append(generated.weights_wait_s)
            self.metrics["timing/generator_s"].append(generated.generate_s)
        return rollouts

    def before_update(self) -> None:
        """The update gets the memory the generator can release."""
        self.generator.sleep()

    def after_update(self, step: int, policy) -> None:
        """Step `step`'s update is applied: version `step` to the generator (it wakes a sleeping one), and the first
        round of the step it samples ahead submitted."""
        try:
            agreed(self.generator.load, policy.publish(step))
        except GeneratorDown as error:
            self.down = error
            return
        if (ahead := self.schedule.ahead_after(step)) is not None:
            self.submit(ahead, 0, self.schedule.first_round, step)

    def take_metrics(self) -> dict[str, float]:
        """The step's, sampling ahead: staleness (mean and max over its rounds, and the fraction of rounds at each
        staleness 0..k), seconds the trainer waited for rollouts and for the generator to take weights, the
        generator for weights."""
        taken, self.metrics = self.metrics, defaultdict(list)
        out = {}
        for key in ("async/token_staleness", "async/partial_frac"):  # over tokens; over responses
            values = taken.pop(key, [])
            if values:
                out[key] = sum(values) / len(values)
        staleness = taken.pop("async/staleness", [])
        if staleness:
            out["async/staleness"] = sum(staleness) / len(staleness)
            out["async/staleness_max"] = float(max(staleness))
            for lag in range(self.schedule.max_staleness + 1):
                out[f"async/staleness_frac_{lag}"] = staleness.count(lag) / len(staleness)
        out.update(self.generator.take_metrics())
        out.update({key: float(sum(values)) for key, values in taken.items()})
        return out

    def state_dict(self) -> dict:
        """This rank's rounds in flight, waited for, with their prompts (plain data, for a checkpoint); a round whose
        samples a failed generator lost is left out (the resumed run draws and samples it anew)."""
        generator = self.generator.state_dict()
        # a generator answering in this process has nothing in flight between steps (its state is empty)
        answered = {tuple(item["key"]) for item in generator.get("results", [])}
        rounds = {key: examples for key, examples in self.examples.items() if key in answered}
        return {"rounds": [{"key": list(key), "examples": [asdict(e) for e in examples]}
                           for key, examples in sorted(rounds.items())],
                "generator": generator}

    def load_state_dict(self, state: dict) -> None:
        """A checkpoint's rounds in flight back (before `start`): they are not sampled again."""
        for item in state["rounds"]:
            self.examples[tuple(item["key"])] = [Example(**e) for e in item["examples"]]
        self.generator.load_state_dict(state["generator"])

    def close(self) -> None:
        self.generator.close()

    # --- sampling and scoring ---

    def submit(self, step: int, round_index: int, count: int, version: int) -> None:
        """Round `round_index` of step `step` (`count` prompts from the sampler) to the generator, to be sampled by
        `version`; nothing for a round already submitted (ahead, or brought back by a checkpoint)."""
        key = (step, round_index)
        if key in self.examples:
            return
        examples = self.examples[key] = self.prompts.sampler.next_batch(count)
        prompt_ids = [self.prompts.encode(examples[i]) for i in self.local_groups(examples)]
        self.generator.submit(GenerateRequest(key, prompt_ids, self.params, self.seed(step, round_index), version))

    def local_groups(self, examples: list[Example]) -> list[int]:
        """This rank's groups of `examples`: every world_size-th one."""
        return list(range(dist.rank(), len(examples), dist.world_size()))

    def scored(self, examples: list[Example], local: list[int], generated: Generated | None,
               timings: Timings) -> StepRollouts:
        """This rank's responses `generated` to its groups `local` of `examples` scored, then every rank's gathered in
        the groups' order."""
        local_rollouts = StepRollouts()
        if local:
            out = generated.responses
            text = self.prompts.decode(out.token_ids)
            questions = [question(examples[i]) for i in local for _ in range(self.params.num_samples)]
            with timings("reward"):
                judged = self.scorer.judge(text, questions)
            mine = [examples[i] for i in local]
            local_rollouts = StepRollouts(mine, [self.prompts.encode(example) for example in mine], out.token_ids, text,
                                          out.truncated, judged.verdicts, out.logprobs or [], scores=judged.scores,
                                          versions=[generated.version] * len(out.token_ids))
        gathered = dist.all_gather_objects(local_rollouts)
        # back to the original group order: group i was generated by rank i % world
        world = dist.world_size()
        merged = StepRollouts()
        for i in range(len(examples)):
            merged.extend(gathered[i % world].group(i // world))
        return merged

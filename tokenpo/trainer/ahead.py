"""Rollouts sampled ahead of the update: the step's source when rollout.async.max_staleness = k >= 1.

The first round of step r is sampled by policy version max(0, r - 1 - k) (version v: the policy after v updates) in
the generator process (tokenpo.rollout.ahead), so while the trainer updates on step r's batch the generator samples
steps r + 1 .. r + k: a batch's staleness at step r is exactly min(k, r - 1) versions, whatever the timing, and a run
samples the same tokens every time (k = 0 is the synchronous `RolloutSource`, which this class is not used for).
DAPO's further rounds of a step are sampled when the step asks for them, by the newest version (staleness 0), after
the rounds already submitted. Every batch carries the behaviour policy's log-probs of its tokens (the sampler's), for
the off-policy correction (algorithm.loss.tis_cap against the trainer's proximal policy, docs/algorithms.md).

A checkpoint holds what is in flight: the rounds submitted for the next steps are waited for and saved with their
version (`in_flight`), and a resumed run takes them back (`restore`) instead of sampling them again.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict

from tokenpo.data import Example
from tokenpo.errors import ConfigError
from tokenpo.rollout.ahead import AheadGenerator, GenerateRequest, Generated
from tokenpo.rollout.engine import Responses
from tokenpo.rollout.weight_stream import policy_weights
from tokenpo.trainer.rollouts import StepRollouts
from tokenpo.trainer.source import RolloutSource
from tokenpo.trainer.timings import Timings


def version_for(step: int, max_staleness: int) -> int:
    """The policy version that samples step `step`'s first round."""
    return max(0, step - 1 - max_staleness)


def generator_device(device: str, world_size: int) -> str:
    """rollout.async.generator_device for this process: one device names one generator, so a CUDA device is refused
    when several processes would each put their generator on it (a device per process is not built yet)."""
    if device != "cpu" and world_size > 1:
        raise ConfigError(f"rollout.async.generator_device={device}: each of the {world_size} processes starts its "
                          f"own generator, and they would share that one device; use cpu with several processes "
                          f"(a device per process is not supported yet)")
    return device


class AheadSource:
    """`RolloutSource`'s interface (draw, after_update, take_metrics) over a generator process."""

    def __init__(self, source: RolloutSource, generator: AheadGenerator, max_staleness: int, first_round: int,
                 max_steps: int, sampler, zero3: bool) -> None:
        self.source, self.generator, self.k = source, generator, max_staleness
        self.first_round, self.max_steps, self.sampler, self.zero3 = first_round, max_steps, sampler, zero3
        self.engine = source.engine  # the step syncs it (the hf engine: nothing to do)
        self.params = dataclasses.replace(source.params, logprobs=True)  # the behaviour policy's log-probs
        self.examples: dict[tuple[int, int], list[Example]] = {}  # each submitted round's prompts (all ranks')
        self.ready: dict[tuple[int, int], Generated] = {}  # restored from a checkpoint
        self.metrics: dict[str, list[float]] = defaultdict(list)

    # --- the schedule ---

    def start(self, policy, step_done: int) -> None:
        """Before the first step to run (`step_done` steps are done): the current weights as version `step_done`,
        and the first rounds of the steps that version samples (none restored from a checkpoint)."""
        self.push(policy, step_done)
        first = step_done + 1
        for step in range(first, min(first + self.k, self.max_steps) + 1):
            if (step, 0) not in self.ready:  # a resumed run has them all back
                self.submit(step, 0, self.first_round, version_for(step, self.k))

    def after_update(self, step: int, policy) -> None:
        """Step `step`'s update is applied: version `step` to the generator (the next step's further rounds and the
        first round of step + k + 1 need it), and that first round submitted."""
        if step < self.max_steps:
            self.push(policy, step)
        if step + self.k + 1 <= self.max_steps:
            self.submit(step + self.k + 1, 0, self.first_round, step)

    def push(self, policy, version: int) -> None:
        waited = self.generator.push(version, policy_weights(getattr(policy, "module", policy.engine), self.zero3))
        self.metrics["timing/trainer_wait_weights_s"].append(waited)

    def submit(self, step: int, round_index: int, count: int, version: int) -> None:
        examples = self.sampler.next_batch(count)
        local, prompt_ids = self.source.local_prompts(examples)
        self.examples[(step, round_index)] = examples
        self.generator.submit(GenerateRequest((step, round_index), prompt_ids, self.params,
                                              self.source.seed(step, round_index), version))

    # --- the step's interface ---

    def draw(self, step: int, round_index: int, count: int, sampler, timings: Timings) -> StepRollouts:
        """Round `round_index` of step `step`: the first round as submitted ahead, a further one sampled now."""
        key = (step, round_index)
        if key not in self.examples:
            self.submit(step, round_index, count, step - 1)
        if key in self.ready:
            generated, waited = self.ready.pop(key), 0.0
        else:
            with timings("generate"):
                generated, waited = self.generator.result(key)
        examples = self.examples.pop(key)
        local, prompt_ids = self.source.local_prompts(examples)
        rollouts = self.source.scored(examples, local, prompt_ids, generated.responses if local else None, timings)
        staleness = step - 1 - generated.version
        self.metrics["async/staleness"].append(staleness)
        self.metrics["timing/trainer_wait_rollouts_s"].append(waited)
        self.metrics["timing/generator_wait_weights_s"].append(generated.weights_wait_s)
        self.metrics["timing/generator_s"].append(generated.generate_s)
        return rollouts

    def take_metrics(self) -> dict[str, float]:
        """The step's: staleness (mean and max over its rounds, and the fraction of rounds at each staleness 0..k),
        seconds the trainer waited for rollouts and for the worker to take weights, the generator for weights."""
        taken, self.metrics = self.metrics, defaultdict(list)
        out = {}
        staleness = taken.pop("async/staleness", [])
        if staleness:
            out["async/staleness"] = sum(staleness) / len(staleness)
            out["async/staleness_max"] = float(max(staleness))
            for lag in range(self.k + 1):
                out[f"async/staleness_frac_{lag}"] = staleness.count(lag) / len(staleness)
        out.update({key: float(sum(values)) for key, values in taken.items()})
        return out

    # --- checkpoints ---

    def in_flight(self) -> list[dict]:
        """Every submitted round, waited for: what a checkpoint saves (plain data)."""
        self.ready.update(self.generator.drain())
        return [{"key": list(key), "version": generated.version, "examples": [dataclasses.asdict(e) for e in
                                                                              self.examples[key]],
                 "responses": dataclasses.asdict(generated.responses)}
                for key, generated in sorted(self.ready.items())]

    def restore(self, saved: list[dict]) -> None:
        """A checkpoint's rounds in flight back as results (before `start`)."""
        for item in saved:
            key = tuple(item["key"])
            self.examples[key] = [Example(**e) for e in item["examples"]]
            self.ready[key] = Generated(key, Responses(**item["responses"]), item["version"], 0.0, 0.0)

    def close(self) -> None:
        self.generator.close()

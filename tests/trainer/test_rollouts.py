"""collect_rollouts under DAPO dynamic sampling, with scripted verdicts: prompts drawn per round, what each
`on_exhausted` policy makes of too few mixed groups, the logged counts, and the prompt sampler's position."""

from __future__ import annotations

import math
import subprocess
import sys
from dataclasses import replace

import pytest
import torch

from tokenpo.algorithms.config import DynamicSamplingConfig
from tokenpo.data import Example, PromptSampler
from tokenpo.errors import ConfigError
from tokenpo.rewards import CORRECT, GOLD_INVALID, WRONG
from tokenpo.rollout.engine import Responses, SamplingParams
from tokenpo.trainer import step as trainer_step
from tokenpo.trainer.rollouts import RolloutSource, StepRollouts, dynamic_sampling_metrics
from tokenpo.trainer.step import collect_rollouts
from tokenpo.trainer.timings import Timings

G = 2
# a group's verdicts: mixed, all right, all wrong, gold answer that does not parse
VERDICTS = {"M": [CORRECT, WRONG], "R": [CORRECT, CORRECT], "W": [WRONG, WRONG], "I": [GOLD_INVALID, GOLD_INVALID]}
NUM_EXAMPLES = 40


class ScriptedEngine:
    """A rollout engine that answers every prompt with G one-token responses and counts its calls (one per round)."""

    def __init__(self) -> None:
        self.calls = 0

    def generate(self, prompt_ids, params, generator):
        self.calls += 1
        return Responses(token_ids=[[7] for _ in prompt_ids for _ in range(G)],
                         truncated=[False] * (len(prompt_ids) * G))


class ScriptedScorer:
    """The prompt drawn i-th (in the sampler's order) gets the verdicts of script[i]: a group's verdicts are looked
    up by its gold answer."""

    def __init__(self, pattern: dict[str, list[str]]) -> None:
        self.pattern = pattern

    def submit(self, text: list[str], golds: list[str]) -> list[str]:
        return golds

    def result(self, golds: list[str]) -> list[str]:
        return [v for start in range(0, len(golds), G) for v in self.pattern[golds[start]]]


class Scripted:
    """collect_rollouts' inputs for `script`: the real PromptSampler (its position after a step is checked too), a
    RolloutSource over the scripted engine and scorer, and the dynamic-sampling settings."""

    def __init__(self, script: str, prompts_per_step: int, mini_batches: int = 1, **dynamic_sampling):
        examples = [Example(f"p{i}", f"problem {i}", f"gold {i}") for i in range(NUM_EXAMPLES)]
        order = PromptSampler(examples, NUM_EXAMPLES, seed=0).next_batch()
        self.draw_order = [ex.uid for ex in order]
        self.sampler = PromptSampler(examples, prompts_per_step, seed=0)
        self.engine = self.make_engine()
        scorer = ScriptedScorer({ex.answer: VERDICTS[kind] for ex, kind in zip(order, script)})
        self.source = RolloutSource(self.engine, scorer, encode=lambda example: [int(example.uid[1:])],
                                    decode=lambda ids: ["text"] * len(ids), params=SamplingParams(G, 4), seed=0,
                                    device=torch.device("cpu"))
        self.prompts_per_step, self.mini_batches = prompts_per_step, mini_batches
        self.sampling = replace(DynamicSamplingConfig(enabled=True), **dynamic_sampling)

    def make_engine(self) -> ScriptedEngine:
        return ScriptedEngine()

    def collect(self, step: int) -> StepRollouts:
        # one process: keep_partial splits the batch over the mini-batches alone
        return collect_rollouts(step, self.source, self.sampler, self.prompts_per_step, self.sampling,
                                parts=self.mini_batches, timings=Timings())

    def uids(self, positions: list[int]) -> list[str]:
        return [self.draw_order[i] for i in positions]


def metrics(batch) -> dict[str, float]:
    return dynamic_sampling_metrics(batch)


def test_rounds_draw_oversample_times_the_batch_and_keep_the_first_mixed_groups():
    # 4 prompts a step x 1.5 = 6 a round; round 1 finds 3 mixed groups, round 2 two more: the first 4 in draw
    # order make the batch, the 5th is dropped
    run = Scripted("MWMRIM" + "WMMWWW", prompts_per_step=4, oversample=1.5, max_gen_batches=5)
    batch = run.collect(step=3)
    assert [ex.uid for ex in batch.examples] == run.uids([0, 2, 5, 7])
    assert batch.verdicts == [CORRECT, WRONG] * 4 and len(batch.response_ids) == 8
    assert run.engine.calls == 2  # two rounds drawn
    assert run.sampler.state_dict()["position"] == 12  # both rounds' prompts consumed: a resume continues after
    assert metrics(batch) == {
        "dynamic_sampling/rounds": 2.0, "dynamic_sampling/prompts": 12.0, "dynamic_sampling/mixed_groups": 5.0,
        "dynamic_sampling/filled_groups": 0.0, "dynamic_sampling/dropped_groups": 1.0,
        "dynamic_sampling/exhausted": 0.0, "dynamic_sampling/filtered_frac": pytest.approx(7 / 12),
        "dynamic_sampling/batch_groups": 4.0}


# two rounds of 6 prompts find 3 mixed groups (positions 0, 7, 9) of the 4 asked for
SHORT = "MWWRWW" + "WMRMWI"


def test_exhausted_rounds_raise_one_line_naming_the_keys_and_counts():
    run = Scripted(SHORT, prompts_per_step=4, oversample=1.5, max_gen_batches=2, on_exhausted="error")
    with pytest.raises(ConfigError) as err:
        run.collect(step=7)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("algorithm.dynamic_sampling: step 7 found 3 mixed groups of the 4 "
                              "data.prompts_per_step asks for in max_gen_batches=2 rounds of 6 prompts")
    assert "on_exhausted=fill or keep_partial" in message


def test_exhausted_rounds_fill_with_the_first_dropped_groups():
    run = Scripted(SHORT, prompts_per_step=4, oversample=1.5, max_gen_batches=2, on_exhausted="fill")
    batch = run.collect(step=1)
    # the 3 mixed groups, then the first group the filter dropped (position 1, all wrong)
    assert [ex.uid for ex in batch.examples] == run.uids([0, 7, 9, 1])
    assert batch.verdicts[-2:] == [WRONG, WRONG]
    assert metrics(batch) == {
        "dynamic_sampling/rounds": 2.0, "dynamic_sampling/prompts": 12.0, "dynamic_sampling/mixed_groups": 3.0,
        "dynamic_sampling/filled_groups": 1.0, "dynamic_sampling/dropped_groups": 0.0,
        "dynamic_sampling/exhausted": 1.0, "dynamic_sampling/filtered_frac": pytest.approx(9 / 12),
        "dynamic_sampling/batch_groups": 4.0}


@pytest.mark.parametrize("mini_batches, kept", [(1, [0, 7, 9]), (2, [0, 7]), (4, [])])
def test_exhausted_rounds_keep_the_mixed_groups_that_split_over_the_mini_batches(mini_batches, kept):
    run = Scripted(SHORT, prompts_per_step=4, mini_batches=mini_batches, oversample=1.5, max_gen_batches=2,
                          on_exhausted="keep_partial")
    batch = run.collect(step=1)
    assert [ex.uid for ex in batch.examples] == run.uids(kept)
    assert len(batch.response_ids) == G * len(kept)
    logged = metrics(batch)
    assert (logged["dynamic_sampling/batch_groups"], logged["dynamic_sampling/dropped_groups"]) == (
        len(kept), 3 - len(kept))
    assert (logged["dynamic_sampling/filled_groups"], logged["dynamic_sampling/exhausted"]) == (0.0, 1.0)


def test_round_size_is_rounded_up_to_a_multiple_of_the_processes(monkeypatch):
    monkeypatch.setattr(trainer_step.dist, "world_size", lambda: 4)
    # generate_and_score with 4 ranks would gather over a process group; this checks only the draw
    monkeypatch.setattr(RolloutSource, "generate_and_score", lambda source, examples, generator, timings: drawn.append(
        len(examples)) or StepRollouts())
    drawn: list[int] = []
    run = Scripted("W" * NUM_EXAMPLES, prompts_per_step=4, oversample=1.5, max_gen_batches=3,
                          on_exhausted="keep_partial")
    run.collect(step=1)
    assert drawn == [8, 8, 8]  # ceil(1.5 x 4) = 6 -> 8 for 4 processes


def test_without_dynamic_sampling_one_round_of_the_batch_is_kept_as_drawn():
    run = Scripted("RWMW" + "M" * 10, prompts_per_step=4, oversample=3.0)
    run.sampling = replace(run.sampling, enabled=False)
    batch = run.collect(step=1)
    assert [ex.uid for ex in batch.examples] == run.uids([0, 1, 2, 3])
    assert run.sampler.state_dict()["position"] == 4
    assert metrics(batch) == {
        "dynamic_sampling/rounds": 1.0, "dynamic_sampling/prompts": 4.0, "dynamic_sampling/mixed_groups": 4.0,
        "dynamic_sampling/filled_groups": 0.0, "dynamic_sampling/dropped_groups": 0.0,
        "dynamic_sampling/exhausted": 0.0, "dynamic_sampling/filtered_frac": 0.0,
        "dynamic_sampling/batch_groups": 4.0}


def test_partial_batches_train_and_an_empty_one_skips_the_update(tmp_path):
    """A tiny DAPO run under keep_partial: each step trains on the mixed groups that split over 2 mini-batches;
    a step with none left logs its sampling counts and no update."""
    from multiproc_util import REPO, by_step, cli_env, read_metrics

    overrides = ["algorithm=dapo", "model=tiny", "logger.mode=disabled", "data.prompts_per_step=4",
                 "rollout.group_size=2", "rollout.max_new_tokens=8", "eval.max_problems=1", "trainer.threads=1",
                 "trainer.print_samples=0", "reward.num_workers=1", "reward.fn=trainer_rewards:even_length",
                 "trainer.mini_batches=2", "trainer.max_steps=4", "algorithm.dynamic_sampling.max_gen_batches=1",
                 "algorithm.dynamic_sampling.oversample=1", "algorithm.dynamic_sampling.on_exhausted=keep_partial",
                 f"hydra.run.dir={tmp_path}"]
    proc = subprocess.run([sys.executable, "-m", "tokenpo.train", *overrides], cwd=REPO, env=cli_env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    steps = [by_step(read_metrics(tmp_path))[step] for step in (1, 2, 3, 4)]
    mixed = [int(step["dynamic_sampling/mixed_groups"]) for step in steps]
    kept = [int(step["dynamic_sampling/batch_groups"]) for step in steps]
    # seed 0 finds 2, 3, 3 and 1 mixed groups of the 4 asked for: 2, 2, 2 and 0 groups trained on
    assert kept == [m // 2 * 2 for m in mixed] and 0 in kept and 2 in kept
    for step, m, k in zip(steps, mixed, kept):
        assert (step["dynamic_sampling/exhausted"], step["dynamic_sampling/dropped_groups"]) == (1.0, m - k)
        assert ("loss" in step) == (k > 0) and step["lr"] > 0
        if k:
            assert step["response_length/mean"] > 0 and math.isfinite(step["loss"])
    assert (tmp_path / "final" / "config.json").is_file()

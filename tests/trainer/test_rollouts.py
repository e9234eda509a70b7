"""collect_rollouts under DAPO dynamic sampling, with scripted verdicts: prompts drawn per round, what each
`on_exhausted` policy makes of too few mixed groups, the logged counts, and the prompt sampler's position."""

from __future__ import annotations

import math
import subprocess
import sys
from dataclasses import replace

import pytest

from support.rollouts import G, NUM_EXAMPLES, Scripted
from tokenpo.errors import ConfigError
from tokenpo.rewards import CORRECT, WRONG
from tokenpo.trainer.core import step as trainer_step
from tokenpo.trainer.core.rollouts import StepRollouts, dynamic_sampling_metrics
from tokenpo.trainer.core.source import RolloutSource


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
    # a draw with 4 ranks would gather over a process group; this checks only the round sizes asked for
    monkeypatch.setattr(RolloutSource, "draw", lambda source, step, round_index, count, timings: drawn.append(
        count) or StepRollouts())
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


@pytest.mark.e2e
def test_partial_batches_train_and_an_empty_one_skips_the_update(tmp_path):
    """A tiny DAPO run under keep_partial: each step trains on the mixed groups that split over 2 mini-batches;
    a step with none left logs its sampling counts and no update."""
    from support.env import REPO, cli_env
    from support.metrics import by_step, read_metrics

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

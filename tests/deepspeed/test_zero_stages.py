"""Every ZeRO stage on 2 processes (gloo, CPU) computes the update that one plain PyTorch process computes.

The ranks (zero_ranks.py) apply one update to a fixed rollout batch under each stage, with the whole batch in
one micro-batch and with gradient accumulation over one-group micro-batches, and export the policy with
Policy.export; the reference is the same trainer code on one process with a plain AdamW engine
written here.
Adam makes the weights nearly blind to a gradient's scale, so the loss and the gradient norm are compared too.
Then every stage trains 2 full steps with train(): same metrics and final weights whatever the stage.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import zero_ranks
from plain_update import (LOSS_ATOL, NORM_RTOL, assert_same_update, exported_weights, initial_weights as weights_before,
                          plain_update)

from support.metrics import by_step, deterministic, read_metrics
from support.runs import run_ranks

pytestmark = pytest.mark.multiproc


@pytest.fixture(scope="module")
def plain():
    return {micro: plain_update(micro) for micro in zero_ranks.MICRO}


@pytest.fixture(scope="module")
def initial_weights():
    return weights_before()


@pytest.fixture(scope="module")
def ranks_out(tmp_path_factory):
    out = tmp_path_factory.mktemp("zero")
    run_ranks(Path(zero_ranks.__file__), [str(out)], 2, out / "logs")
    return out


def test_accumulation_matches_one_micro_batch_on_one_process(plain, initial_weights):
    (whole, whole_w, _), (acc, acc_w, _) = plain["whole"], plain["accumulated"]
    assert acc["loss"] == pytest.approx(whole["loss"], abs=LOSS_ATOL)
    assert acc["grad_norm"] == pytest.approx(whole["grad_norm"], rel=NORM_RTOL)
    assert_same_update(acc_w, whole_w, initial_weights, min_change=1e-3)


@pytest.mark.parametrize("micro", list(zero_ranks.MICRO))
@pytest.mark.parametrize("stage", zero_ranks.STAGES)
def test_two_ranks_match_one_process(stage, micro, ranks_out, plain, initial_weights):
    want_metrics, want_weights, want_sample = plain["whole"]
    report = json.loads((ranks_out / "update" / f"{stage}-{micro}.json").read_text())
    got = report["metrics"]
    # 0.5 clipping threshold: the gradient norm is clipped, so a wrong gradient scale would show only here
    assert want_metrics["grad_norm"] > 0.5
    assert got["grad_norm"] == pytest.approx(want_metrics["grad_norm"], rel=NORM_RTOL)
    assert got["loss"] == pytest.approx(want_metrics["loss"], abs=LOSS_ATOL)
    for key in ("kl/ref", "advantage/abs_mean", "entropy/mean", "lr", "reward/mean"):
        assert got[key] == pytest.approx(want_metrics[key], rel=1e-5, abs=1e-7), key
    assert_same_update(exported_weights(ranks_out / "update" / f"{stage}-{micro}"), want_weights, initial_weights,
                       min_change=1e-3)
    # generation after the update (under ZeRO-3 with gathered parameters) samples what the plain model samples
    assert report["sample"] == want_sample
    sharded = stage.startswith("zero3")
    assert (report["policy_sharded"], report["reference_sharded"]) == (sharded, sharded)
    assert report["loaded_sharded"] == sharded  # ZeRO-3 loads the model partitioned, before its engine
    assert report["backward_allreduce"]  # two ranks always reduce their gradients


@pytest.fixture(scope="module")
def one_rank_out(tmp_path_factory):
    out = tmp_path_factory.mktemp("zero_one_rank")
    run_ranks(Path(zero_ranks.__file__), [str(out), "zero0", "zero1"], 1, out / "logs")
    return out


@pytest.mark.parametrize("micro", list(zero_ranks.MICRO))
@pytest.mark.parametrize("stage", ["zero0", "zero1"])
def test_one_deepspeed_process_matches_plain_pytorch(stage, micro, one_rank_out, plain, initial_weights):
    """One process skips stage 0's gradient all-reduce (build_policy_engine): still the plain update."""
    want_metrics, want_weights, _ = plain[micro]
    report = json.loads((one_rank_out / "update" / f"{stage}-{micro}.json").read_text())
    assert report["backward_allreduce"] == (stage != "zero0")
    got = report["metrics"]
    assert got["grad_norm"] == pytest.approx(want_metrics["grad_norm"], rel=NORM_RTOL)
    assert got["loss"] == pytest.approx(want_metrics["loss"], abs=LOSS_ATOL)
    assert_same_update(exported_weights(one_rank_out / "update" / f"{stage}-{micro}"), want_weights, initial_weights,
                       min_change=1e-3)


@pytest.mark.parametrize("stage", zero_ranks.STAGES[:-1])
def test_every_stage_trains_two_steps_alike(stage, ranks_out, initial_weights):
    run = ranks_out / "train" / stage
    records = by_step(read_metrics(run))
    assert sorted(records) == [0, 1, 2]
    baseline = by_step(read_metrics(ranks_out / "train" / "zero0"))
    # how the passes were laid out differs by design: under ZeRO-3 on 2 ranks each pass is one decoder call (padded)
    layout = ("batch/padding_frac", "batch/tokens_per_micro_batch")
    for step in (1, 2):
        got, want = deterministic(records[step]), deterministic(baseline[step])
        assert got.keys() == want.keys()
        for key in set(want) - set(layout):
            assert got[key] == pytest.approx(want[key], rel=1e-5, abs=1e-6), (step, key)
    assert records[1]["grad_norm"] > 0
    assert_same_update(exported_weights(run / "final"), exported_weights(ranks_out / "train" / "zero0" / "final"),
                       initial_weights, min_change=1e-3)

"""Every shipped algorithm (conf/algorithm/*.yaml) updates alike on 2 processes under ZeRO and on one plain PyTorch
process: zero_ranks' fixed batch, two mini-batches (the second off-policy, so clips, gates and masks act), one group
per micro-batch on each rank or packed token budgets, every stage (~2 s per algorithm, stage and split here).
"""

from __future__ import annotations

import json
from pathlib import Path

import algorithm_ranks
import pytest
import zero_ranks
from plain_update import LOSS_ATOL, NORM_RTOL, assert_same_update, exported_weights, initial_weights, plain_update

from support.config import ALGORITHM_NAMES
from support.runs import run_ranks

pytestmark = pytest.mark.multiproc

# ZeRO-3 offload moves nothing on CPU; its update is the one of test_zero_stages
STAGES = zero_ranks.STAGES[:-1]
# one group per pass, and packed token budgets whose passes hold rows of several groups
MICROS = ("accumulated", "packed")
PAIRS = [(algorithm, stage, micro) for algorithm in ALGORITHM_NAMES for stage in STAGES for micro in MICROS]


@pytest.fixture(scope="module")
def ranks_out(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("algorithm_stages")
    run_ranks(Path(algorithm_ranks.__file__), [str(out), *(f"{a}:{s}:{m}" for a, s, m in PAIRS)], 2, out / "logs",
              timeout_s=60 + 20 * len(PAIRS))
    return out


@pytest.fixture(scope="module")
def plain():
    """{algorithm: its one-process update}, computed once per algorithm."""
    return {}


@pytest.fixture(scope="module")
def before():
    return initial_weights()


@pytest.mark.parametrize(("algorithm", "stage", "micro"), PAIRS)
def test_every_algorithm_on_two_ranks_matches_one_process(algorithm, stage, micro, ranks_out, plain, before):
    if algorithm not in plain:
        plain[algorithm] = plain_update("whole", algorithm)
    want_metrics, want_weights, _ = plain[algorithm]
    got = json.loads((ranks_out / algorithm / f"{stage}-{micro}.json").read_text())["metrics"]
    assert want_metrics["grad_norm"] > 0
    assert got["grad_norm"] == pytest.approx(want_metrics["grad_norm"], rel=NORM_RTOL)
    assert got["loss"] == pytest.approx(want_metrics["loss"], abs=LOSS_ATOL)
    assert got.keys() == want_metrics.keys()
    assert_same_update(exported_weights(ranks_out / algorithm / f"{stage}-{micro}"), want_weights, before,
                       min_change=1e-4)

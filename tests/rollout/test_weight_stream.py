"""The vllm engine's weight stream (`policy_weights`) under ZeRO-3 on 2 processes: every rank gets every full
weight, and only the module being handed over is gathered at a time."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

TRAINER_TESTS = str(Path(__file__).resolve().parents[1] / "trainer")
if TRAINER_TESTS not in sys.path:
    sys.path.insert(0, TRAINER_TESTS)

from multiproc_util import SMALL, compose_config, run_ranks  # noqa: E402

from tokenpo.models.loading import load_model  # noqa: E402
from tokenpo.rollout.vllm_engine import policy_weights  # noqa: E402

pytestmark = pytest.mark.multiproc


def test_zero3_stream_gives_every_rank_the_full_weights_one_module_at_a_time(tmp_path):
    run_ranks(Path(__file__).with_name("weight_stream_ranks.py"), [str(tmp_path)], nproc=2, log_dir=tmp_path)
    cfg, _ = compose_config(SMALL + ["deepspeed=zero3"])
    _, model = load_model(cfg.model, cfg.seed)
    expected = dict(policy_weights(model, zero3=False))
    assert "lm_head.weight" in expected and len(expected) > 10
    for rank in range(2):
        streamed = torch.load(tmp_path / f"rank{rank}.pt")
        assert streamed["gathered_elsewhere"] == []
        assert list(streamed["weights"]) == list(expected)
        for name, weight in expected.items():
            torch.testing.assert_close(streamed["weights"][name], weight, rtol=0, atol=0, msg=name)

"""LoRA on 2 processes (gloo, CPU) under every ZeRO stage with gradient accumulation: the same metrics and merged
export whatever the stage, exact resume under ZeRO-3 with adapter-only checkpoints, and activation checkpointing
with an entropy bonus giving what the plain backward gives (lora_ranks.py runs them)."""

from __future__ import annotations

from pathlib import Path

import lora_ranks
import pytest
import torch
from support.metrics import by_step, deterministic, read_metrics
from support.runs import run_ranks
from peft import PeftConfig
from transformers import AutoModelForCausalLM

pytestmark = [pytest.mark.multiproc, pytest.mark.slow]

# float noise between stages: summation order differs (see test_zero_stages.py)
WEIGHT_ATOL = 5e-5


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("lora_stages")
    run_ranks(Path(lora_ranks.__file__), [str(out)], 2, out / "logs", timeout_s=900)
    return out


def merged_weights(run: Path) -> dict[str, torch.Tensor]:
    return {k: v.detach() for k, v in AutoModelForCausalLM.from_pretrained(run / "final").state_dict().items()}


def assert_close_metrics(got: dict, want: dict, rel: float = 1e-5) -> None:
    got, want = deterministic(got), deterministic(want)
    assert got.keys() == want.keys()
    for key in want:
        assert got[key] == pytest.approx(want[key], rel=rel, abs=1e-6), key


@pytest.mark.parametrize("stage", lora_ranks.STAGES[1:])
def test_every_stage_trains_lora_alike(stage, runs):
    got, want = by_step(read_metrics(runs / stage)), by_step(read_metrics(runs / "zero0"))
    assert sorted(got) == [0, 1, 2]
    for step in (1, 2):
        assert_close_metrics(got[step], want[step])
    assert want[2]["kl/ref"] > 0 and want[1]["grad_norm"] > 0
    reference = merged_weights(runs / "zero0")
    for key, value in merged_weights(runs / stage).items():
        torch.testing.assert_close(value, reference[key], rtol=0, atol=WEIGHT_ATOL, msg=key)
    assert PeftConfig.from_pretrained(runs / stage / "final" / "adapter").r == 4


def unevaluated(record: dict) -> dict:
    return {k: v for k, v in deterministic(record).items() if not k.startswith("eval/")}


def test_zero3_lora_resume_is_exact_and_saves_no_base(runs):
    got, want = by_step(read_metrics(runs / "zero3_resumed")), by_step(read_metrics(runs / "zero3"))
    assert sorted(got) == [0, 1, 2]
    # step 1 was the first attempt's last step, evaluated there only
    assert unevaluated(got[1]) == unevaluated(want[1]) and "eval/accuracy" in got[1]
    assert deterministic(got[2]) == deterministic(want[2])
    base_bytes = (runs / "zero3" / "final" / "model.safetensors").stat().st_size
    for path in (runs / "zero3_resumed" / "checkpoints").glob("step_*"):
        assert sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) < base_bytes, path


def test_activation_checkpointing_with_entropy_bonus_matches_the_plain_backward(runs):
    got = by_step(read_metrics(runs / "zero2_entropy_checkpointed"))
    want = by_step(read_metrics(runs / "zero2_entropy"))
    for step in (1, 2):
        # the checkpointed pass repeats each prompt instead of sharing its KV cache: float summation order only
        assert_close_metrics(got[step], want[step], rel=1e-4)
    assert want[1]["grad_norm"] > 0

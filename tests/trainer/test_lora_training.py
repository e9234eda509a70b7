"""Whole tiny LoRA runs (one process): no reference copy is built, checkpoints hold the adapters and their optimizer
state but not the frozen base, a resumed run logs what an uninterrupted one logs, a resume with other LoRA settings
is refused in one line, and final/ holds the merged model and final/adapter the PEFT adapter."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from peft import PeftModel
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from support.config import ALGORITHM_NAMES, SMALL, compose_config
from support.metrics import by_step, deterministic, read_metrics
from support.runs import in_process_training, train_run
from tokenpo.deepspeed import engine
from tokenpo.errors import ConfigError
from tokenpo.models.lora import peft_quietly
from tokenpo.trainer.core import policy

# four tiny runs: ~25 s on an idle 2-core machine
pytestmark = pytest.mark.slow
LORA = ["model.lora.rank=4", "trainer.lr=1e-2", "trainer.warmup_steps=0"]
RUN = SMALL + LORA + ["eval.max_problems=2"]
# merged fp32 weights against the adapted model's two-term forward (float32 rounding of logits of size ~1)
MERGE_ATOL = 1e-4


def no_reference_copy(*args, **kwargs):
    raise AssertionError("a LoRA run built a reference model")


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    """A: 3 uninterrupted steps; B: 2 steps saving each, then resumed to 3; C: B's checkpoint resumed at rank 8."""
    out = tmp_path_factory.mktemp("lora")
    patch = pytest.MonkeyPatch()
    patch.setattr(policy, "build_reference", no_reference_copy)
    patch.setattr(engine, "build_reference", no_reference_copy)
    try:
        with in_process_training():
            train_run(out / "A", RUN + ["trainer.max_steps=3"])
            train_run(out / "B", RUN + ["trainer.max_steps=2", "trainer.save_every=1"])
            train_run(out / "B", RUN + ["trainer.max_steps=3", "trainer.save_every=1", "trainer.resume=auto"])
            with pytest.raises(ConfigError) as err:
                train_run(out / "C", RUN + ["trainer.max_steps=3", "model.lora.rank=8",
                                            f"trainer.resume={out / 'B' / 'checkpoints' / 'step_000002'}"])
            (out / "C.error").write_text(str(err.value))
    finally:
        patch.undo()
    return out


def test_kl_to_the_base_is_computed_without_a_reference_copy(runs):
    steps = by_step(read_metrics(runs / "A"))
    assert "timing/reference_s" in steps[1]
    # on-policy at step 1: the adapters start at B = 0, so the policy is its reference
    assert steps[1]["kl/ref"] == 0.0
    assert steps[3]["kl/ref"] > 0 and steps[2]["grad_norm"] > 0


def test_resumed_lora_run_logs_what_the_uninterrupted_one_logs(runs):
    a, b = by_step(read_metrics(runs / "A")), by_step(read_metrics(runs / "B"))
    assert sorted(b) == [0, 1, 2, 3]
    assert deterministic(b[1]) == deterministic(a[1])
    # step 2 was the first attempt's last step, evaluated there only; step 3 ran after the resume
    assert unevaluated(b[2]) == unevaluated(a[2]) and "eval/accuracy" in b[2]
    assert deterministic(b[3]) == deterministic(a[3]) and "eval/accuracy" in b[3]


def unevaluated(record: dict) -> dict:
    return {k: v for k, v in deterministic(record).items() if not k.startswith("eval/")}


def test_checkpoint_holds_adapters_and_their_optimizer_state_not_the_base(runs):
    path = runs / "B" / "checkpoints" / "step_000003"
    meta = json.loads((path / "tokenpo.json").read_text())
    assert meta["lora"] == {"rank": 4, "alpha": 32.0, "dropout": 0.0, "init": "default",
                            "target_modules": "all-linear", "modules_to_save": []}
    states = torch.load(path / "state" / "mp_rank_00_model_states.pt", weights_only=False)
    saved = set(states["module"])
    assert saved and all(".lora_A." in k or ".lora_B." in k for k in saved)
    optimizer = states["optimizer"]["state"]
    assert len(optimizer) == len(saved)  # one AdamW state per adapter tensor, none for the base
    assert states["step"] == 3 and states["sampler"]  # DeepSpeed's and tokenpo's client state
    # the adapters, their two AdamW moments and small files: less than the base weights alone (a full fine-tuning
    # checkpoint holds the weights and both moments of every parameter, 3x the base)
    base_bytes = (runs / "A" / "final" / "model.safetensors").stat().st_size
    adapter_bytes = sum(t.numel() * t.element_size() for t in states["module"].values())
    checkpoint_bytes = sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    assert 3 * adapter_bytes < checkpoint_bytes < base_bytes, (adapter_bytes, checkpoint_bytes, base_bytes)


def test_resume_with_other_lora_settings_is_one_line(runs):
    message = (runs / "C.error").read_text()
    assert message.startswith(f"checkpoint {runs / 'B' / 'checkpoints' / 'step_000002'} was trained with other "
                              "LoRA settings: resume it with model.lora.rank=4 (not 8)")
    assert "\n" not in message


def test_final_holds_the_merged_model_and_the_adapter(runs, capsys):
    final = runs / "A" / "final"
    merged = AutoModelForCausalLM.from_pretrained(final)
    config = json.loads((final / "adapter" / "adapter_config.json").read_text())
    assert config["r"] == 4 and config["lora_alpha"] == 32
    assert all("lora_" in k for k in load_file(final / "adapter" / "adapter_model.safetensors"))
    # the base the adapter was trained on: the run's tiny model (rank 0: without adapters), as the run built it
    from tokenpo.models.loading import load_model

    cfg, _ = compose_config(RUN + ["model.lora.rank=0"])
    tokenizer, base = load_model(cfg.model, cfg.seed)
    with peft_quietly():
        adapted = PeftModel.from_pretrained(base, final / "adapter")
    ids = torch.tensor([tokenizer("What is 2 + 3?")["input_ids"]])
    with torch.no_grad():
        gap = float((merged(input_ids=ids).logits - adapted(input_ids=ids).logits).abs().max())
        with adapted.disable_adapter():
            trained = float((merged(input_ids=ids).logits - adapted(input_ids=ids).logits).abs().max())
    with capsys.disabled():
        print(f"\nfinal/ merged vs base + final/adapter: max |delta logit| = {gap:.2e} (vs the base: {trained:.2e})")
    assert gap < MERGE_ATOL and trained > 10 * MERGE_ATOL



ALGORITHMS = ALGORITHM_NAMES  # every conf/algorithm/*.yaml


@pytest.fixture(scope="module")
def algorithm_runs(tmp_path_factory) -> Path:
    """One LoRA step of every algorithm (two updates per rollout), in one process group."""
    out = tmp_path_factory.mktemp("lora_algorithms")
    with in_process_training():
        for algorithm in ALGORITHMS:
            train_run(out / algorithm, RUN + [f"algorithm={algorithm}", "trainer.max_steps=1", "trainer.mini_batches=2"])
    return out


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_every_algorithm_trains_lora_adapters(algorithm, algorithm_runs):
    step = by_step(read_metrics(algorithm_runs / algorithm))[1]
    assert step["grad_norm"] > 0 and step["loss"] == step["loss"]  # not NaN
    assert (algorithm_runs / algorithm / "final" / "adapter" / "adapter_config.json").is_file()

"""tokenpo.train prints the plan's total at start-up, for the longest prompt of the run's data, and refuses, in one
line and before any model loads, a run whose plan exceeds trainer.memory_limit."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from support.cli import GUARDED_TRAIN, guarded_train, heavy_imports, start_error, start_up_errors
from support.env import REPO
from tokenpo.plan import build_plan, format_bytes
from tokenpo.plan.cli import compose_train_config
from tokenpo.plan.memory import device_type

# every test starts `python -m tokenpo.train` in a subprocess
pytestmark = pytest.mark.e2e


def test_a_plan_over_the_memory_limit_stops_before_the_model_loads(tmp_path):
    # planned for the data's longest prompt: 82 tokens of the tiny tokenizer (tests/plan/test_context.py)
    total = build_plan(compose_train_config(["model=tiny"]), 1, prompt_tokens=82, device=device_type()).total_bytes
    errors = start_up_errors(tmp_path, "model=tiny", f"trainer.memory_limit={total - 1}")
    assert len(errors) == 1
    error = errors[0]
    assert error.startswith(f"tokenpo: error: memory plan: {format_bytes(total)} per process exceeds "
                            f"trainer.memory_limit {format_bytes(total - 1)}; suggested: trainer.micro_batch_size=16")


def test_the_tiny_models_refusal_counts_prompts_without_torch(tmp_path):
    """The prompt lengths the plan needs come from the tiny model's byte tokenizer, built with transformers'
    tokenizer alone: torch and transformers' model code (seconds) are never imported for the refusal."""
    proc = guarded_train(tmp_path, "model=tiny", "trainer.memory_limit=1KiB")
    assert "tokenpo: error: memory plan: " in proc.stderr and "HEAVY WORK" not in proc.stderr, proc.stderr
    assert heavy_imports(proc) == ["transformers"]


def test_a_bad_memory_limit_names_the_key(tmp_path):
    error = start_error(tmp_path, "model=tiny", "trainer.memory_limit=lots")
    assert "trainer.memory_limit must be a byte count such as 85899345920, 80GiB or 80GB, got 'lots'" in error


def test_a_plan_within_the_limit_prints_its_total_and_goes_on(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(Path(__file__).parents[1]),
                                                                     os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, "-c", GUARDED_TRAIN, "model=tiny", "logger.mode=disabled",
                           "trainer.memory_limit=80GiB", f"hydra.run.dir={tmp_path / 'run'}"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if "memory plan: " in line]
    assert len(lines) == 1, proc.stdout + proc.stderr
    assert ("per process at the update phase's peak of 80.00 GiB (trainer.memory_limit), for the data's longest prompt "
            "(82 tokens); python -m tokenpo.plan <the same overrides> --prompt-tokens 82 lists its parts") in lines[0]

"""Worst case first: the pass before step 1 leaves the run's metrics bit-identical, and an out-of-memory error there
or at a later step is one line naming where, the shapes and the plan's suggestion, with the last checkpoint intact."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch

from support.config import SMALL
from support.metrics import by_step, deterministic, read_metrics
from support.runs import in_process_training, train_run
from tokenpo.errors import ConfigError
from tokenpo.trainer.harness import checkpoint
from tokenpo.trainer.core import step as trainer_step
from tokenpo.trainer.core.policy import Policy

# every pass the check repeats: old log-probs (2 mini-batches), the KL reference (GRPO's beta), the entropy's
# gradient; ZeRO-2 accumulates the zero gradients the check leaves in its own partitions
PASSES = [*SMALL, "trainer.mini_batches=2", "algorithm.loss.entropy_coef=0.01", "deepspeed=zero2"]


def out_of_memory(*args, **kwargs):
    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")


def failing_run(run_dir: Path, overrides: list[str], module, name: str, replacement) -> str:
    """The one-line error of a run with `module.name` replaced."""
    with pytest.MonkeyPatch.context() as patch, pytest.raises(ConfigError) as err:
        patch.setattr(module, name, replacement)
        train_run(run_dir, overrides)
    return str(err.value)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """Runs with the check off and on; one whose check runs out of memory; one that runs out at step 2 after
    saving step 1 (train() in this process: every run in one process group)."""
    out = tmp_path_factory.mktemp("worst_case")
    messages = []
    handler = logging.Handler()
    handler.emit = lambda record: messages.append(record.getMessage())
    logger = logging.getLogger("tokenpo")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    real = trainer_step.update_policy
    calls = []

    def second_step_runs_out(*args):
        calls.append(1)
        if len(calls) == 2:
            out_of_memory()
        return real(*args)

    try:
        with in_process_training():
            train_run(out / "off", [*PASSES, "trainer.max_steps=2", "trainer.worst_case_first=false"])
            train_run(out / "on", [*PASSES, "trainer.max_steps=2", "trainer.worst_case_first=true"])
            in_check = failing_run(out / "check", [*SMALL, "trainer.max_steps=2", "trainer.worst_case_first=true"],
                                   Policy, "logprobs", out_of_memory)
            at_step = failing_run(out / "later", [*SMALL, "trainer.max_steps=3", "trainer.save_every=1"],
                                  trainer_step, "update_policy", second_step_runs_out)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    return {"dir": out, "messages": messages, "in_check": in_check, "at_step": at_step}


@pytest.mark.e2e
def test_metrics_are_bit_identical_with_the_check_on_or_off(runs):
    off, on = by_step(read_metrics(runs["dir"] / "off")), by_step(read_metrics(runs["dir"] / "on"))
    assert sorted(off) == sorted(on) == [0, 1, 2]
    for step in (1, 2):
        assert deterministic(on[step]) == deterministic(off[step]), step
    assert on[2]["grad_norm"] > 0
    ran = [m for m in runs["messages"] if m.startswith("worst case first: ")]
    # the "on" run only (the failing check logs nothing): 4 prompts / 2 mini-batches = 2 groups of 2 responses of 8 tokens
    assert len(ran) == 1 and "forward + backward of 4 sequences x (" in ran[0] and " + 8) tokens" in ran[0]


def test_out_of_memory_in_the_check_is_one_line_with_the_plans_suggestion(runs):
    message = runs["in_check"]
    assert "\n" not in message
    assert message.startswith("out of memory in the worst-case pass before step 1 (8 sequences generated at once, "
                              "micro-batches of 8 sequences, prompts up to ")
    assert "+ responses up to 8 tokens); suggested: trainer.micro_batch_size=" in message
    assert not (runs["dir"] / "check" / "checkpoints").exists()


def test_out_of_memory_at_a_later_step_keeps_the_last_checkpoint(runs):
    assert runs["at_step"].startswith("out of memory in step 2 (8 sequences generated at once")
    run_dir = runs["dir"] / "later"
    assert json.loads((run_dir / "checkpoints" / "latest").read_text())["step"] == 1
    assert checkpoint.find_resume_dir("auto", run_dir) == run_dir / "checkpoints" / "step_000001"
    assert [r["step"] for r in read_metrics(run_dir)] == [0, 1]

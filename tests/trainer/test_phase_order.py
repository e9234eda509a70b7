"""The memory choreography of a run with a colocated engine: the real training loop on the tiny model with an engine
that records every call the trainer makes, and torch.cuda.empty_cache recorded beside it.

On a GPU the order decides what is resident at once: the engine must be asleep for the worst-case pass and each
update (they get the memory it releases), the update's cached blocks handed back before the engine wakes into its
own pool, and the engine woken by the sync (after vLLM's sleep level 2 it has no weights until then)."""

from __future__ import annotations

import itertools

import pytest

from support.config import SMALL
from support.runs import in_process_training, train_run
from tokenpo.rollout.engine import ENGINES
from tokenpo.rollout.hf import HFEngine
from tokenpo.trainer.harness import evals
from tokenpo.trainer.harness import loop
from tokenpo.trainer.core import step

# the trainer's phases (recorded around the loop's own functions) and the engine's calls, in the order they ran
EXPECTED = [
    "build",
    # the worst-case pass with the engine asleep, then the first version's load that wakes it
    "sleep", "worst_case", "load",
    # the evaluation before training, then every step: rollouts, sleep, update, the new version's load (which wakes)
    "evaluate", "sample",
    "rollouts", "sample", "sleep", "update", "load",
    "rollouts", "sample", "sleep", "update", "load",
    # the last step's evaluation, with the engine awake and loaded
    "evaluate", "sample",
    "close",
]


@pytest.fixture
def calls(monkeypatch) -> list[str]:
    """Every call, in order; an engine named `recording` (the hf engine underneath) for the run."""
    recorded: list[str] = []

    class RecordingEngine(HFEngine):
        def __init__(self, *args) -> None:
            recorded.append("build")
            super().__init__(*args)

    for name in ("sample", "sleep", "wake_up", "load", "close"):
        def method(self, *args, _name=name, **kwargs):
            recorded.append(_name)
            return getattr(HFEngine, _name)(self, *args, **kwargs)
        setattr(RecordingEngine, name, method)

    def recorded_call(label, function):
        def call(*args, **kwargs):
            recorded.append(label)
            return function(*args, **kwargs)
        return call

    monkeypatch.setitem(ENGINES._functions, "recording", RecordingEngine)
    monkeypatch.setitem(ENGINES._traits, "recording", {})
    monkeypatch.setattr(loop, "run_worst_case", recorded_call("worst_case", loop.run_worst_case))
    monkeypatch.setattr(step, "collect_rollouts", recorded_call("rollouts", step.collect_rollouts))
    monkeypatch.setattr(step, "update_policy", recorded_call("update", step.update_policy))
    monkeypatch.setattr(evals.Evaluator, "__call__", recorded_call("evaluate", evals.Evaluator.__call__))
    return recorded


def test_engine_sleeps_for_the_worst_case_and_each_update_and_wakes_by_the_load_of_the_next_version(
        calls, tmp_path):
    with in_process_training():
        train_run(tmp_path / "run", [*SMALL, "rollout.engine=recording", "trainer.max_steps=2",
                                     "trainer.worst_case_first=true", "eval.every_steps=0"])
    # one generate call or several (dynamic sampling rounds, evaluation batches) count as one phase
    phases = [name for name, _ in itertools.groupby(calls)]
    assert phases == EXPECTED
    assert "wake_up" not in calls  # the load wakes the engine; nothing samples from a sleeping one

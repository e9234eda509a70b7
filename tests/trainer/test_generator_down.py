"""A generator whose process or servers die (`GeneratorDown`) ends the run in one line with a checkpoint the same
command resumes from: before a step's update (the step before it is saved) and in the push after it (the step is
finished, logged and saved). A stand-in engine fails where a server would."""

from __future__ import annotations

import json

import pytest

from support.config import SMALL
from support.runs import in_process_training, train_run
from tokenpo.rollout.engine import ENGINES
from tokenpo.rollout.generator import GeneratorDown
from tokenpo.rollout.hf import HFEngine

RUN = [*SMALL, "trainer.max_steps=3", "eval.before_training=false", "eval.every_steps=0", "rollout.engine=failing"]


class FailingEngine(HFEngine):
    """The hf engine, whose server dies when it is asked to sample step FAIL_AT's rollouts (draw) or to take
    policy version FAIL_AT (push)."""

    fail_at: tuple[str, int] | None = None

    def submit(self, request):
        if self.fail_at == ("draw", request.key[0]):
            raise GeneratorDown(f"vLLM server http://127.0.0.1:8100 died sampling step {request.key[0]}")
        super().submit(request)

    def load(self, published):
        if self.fail_at == ("push", published.version):
            raise GeneratorDown(f"pushing policy version {published.version}: vLLM server http://127.0.0.1:8100 "
                                f"stopped answering")
        super().load(published)


@pytest.fixture
def failing(monkeypatch):
    monkeypatch.setitem(ENGINES._functions, "failing", FailingEngine)
    monkeypatch.setitem(ENGINES._traits, "failing", {})
    return FailingEngine


def steps_logged(run_dir) -> list[int]:
    return [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("where, saved_at", [("draw", 1), ("push", 2)])
def test_a_dead_generator_saves_the_run_and_the_same_command_resumes_it(tmp_path, failing, monkeypatch, where,
                                                                         saved_at):
    run_dir = tmp_path / "run"
    monkeypatch.setattr(failing, "fail_at", (where, 2))
    with in_process_training(), pytest.raises(GeneratorDown) as caught:
        train_run(run_dir, RUN)
    message = str(caught.value)
    assert "\n" not in message and "http://127.0.0.1:8100" in message
    assert message.endswith(f"(the run saved its checkpoint at step {saved_at}: the same command resumes it)")
    assert (run_dir / "checkpoints" / f"step_{saved_at:06d}").is_dir()
    assert steps_logged(run_dir) == list(range(1, saved_at + 1))
    monkeypatch.setattr(failing, "fail_at", None)  # the server is back
    with in_process_training():
        summary = train_run(run_dir, RUN)
    assert summary["steps"] == 3
    assert steps_logged(run_dir) == [1, 2, 3]

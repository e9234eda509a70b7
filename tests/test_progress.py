"""Issue 23 item 2: long work shows a bar (done/total, rate, time left) on a terminal, and nothing but the usual log
lines when output goes to a pipe, where the libraries' own bars (transformers' "Writing model shards") are off too."""

from __future__ import annotations

import subprocess
import sys

import pytest

from support.cli import env_without_progress_settings, run_in_pty

# an evaluation of 6 problems (a stand-in policy), a tiny model saved with transformers and a folder hashed as a
# checkpoint's manifest is: the three kinds of long work, as tokenpo.train and tokenpo.evaluate start them
LONG_WORK = """
import sys
from pathlib import Path

from tokenpo.progress import quiet_library_bars

quiet_library_bars()
from tokenpo.data import Example
from tokenpo.evaluation.config import EvalConfig
from tokenpo.evaluation.run import EvalTask, TextSampler, evaluate
from tokenpo.models.config import ModelConfig
from tokenpo.models.loading import load_model
from tokenpo.rewards import AnswerSpec
from tokenpo.rollout.engine import Responses
from tokenpo.trainer.harness.checkpoint_manifest import manifest_records


class Scorer:
    def score(self, texts, golds):
        return ["wrong"] * len(texts)


class Tokenizer:
    def batch_decode(self, ids, skip_special_tokens):
        return ["AB"] * len(ids)


def generate(prompts, params, generator):
    return Responses([[65, 66]] * (len(prompts) * params.num_samples), [False] * (len(prompts) * params.num_samples))


examples = [Example(uid=str(i), problem=f"{i} + 1?", answer=str(i + 1)) for i in range(6)]
task = EvalTask(EvalConfig(name="arith", batch_size=2), examples, [[1, 2]] * len(examples),
                AnswerSpec(reasoning_tag=None), max_new_tokens=4, stop_token_ids=())
metrics = evaluate(task, TextSampler(generate, Tokenizer()), Scorer(), seed=0).metrics
out = Path(sys.argv[1])
tokenizer, model = load_model(ModelConfig(name="tiny", source="tiny"))
model.save_pretrained(out)
manifest_records(out)
print("LONG WORK DONE", metrics["accuracy"])
"""


@pytest.mark.e2e
def test_a_terminal_gets_bars_with_done_total_rate_and_time_left(tmp_path):
    out = run_in_pty([sys.executable, "-c", LONG_WORK, str(tmp_path / "model")], env_without_progress_settings())
    assert "LONG WORK DONE 0.0" in out
    evaluation = [frame for frame in out.replace("\r", "\n").splitlines() if frame.startswith("eval arith (greedy)")]
    assert evaluation and "6/6" in evaluation[-1] and "response/s" in evaluation[-1]
    assert any("<" in frame and "0/6" in frame for frame in evaluation)  # elapsed<left, from the first frame on
    assert "checksums of model" in out and "Writing model shards" in out


@pytest.mark.e2e
def test_a_pipe_gets_no_bar_at_all(tmp_path):
    done = subprocess.run([sys.executable, "-c", LONG_WORK, str(tmp_path / "model")], capture_output=True,
                          text=True, env=env_without_progress_settings(), timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "LONG WORK DONE 0.0"
    assert "\r" not in done.stderr and "%|" not in done.stderr and "it/s" not in done.stderr, done.stderr
    assert "Writing model shards" not in done.stderr and "eval arith" not in done.stderr
    assert (tmp_path / "model" / "config.json").is_file()

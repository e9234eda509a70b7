"""Synthetic tokenpo run dirs with hand-chosen metrics, laid out like a Hydra multirun."""

import contextlib
import io
import json
import sys
import types

import pytest
import yaml

from tokenpo.compare import main

# (algorithm, seed) -> eval/accuracy at steps 2 and 4; grpo logs 10 s per step, dapo 5 s per step
EVAL_ACCURACY = {
    ("grpo", 0): (0.25, 0.5),
    ("grpo", 1): (1.0, 0.75),
    ("grpo", 2): (0.25, 0.25),
    ("dapo", 0): (0.5, 0.75),
    ("dapo", 1): (0.5, 0.5),
    ("dapo", 2): (0.25, 0.75),
}
SECONDS_PER_STEP = {"grpo": 10.0, "dapo": 5.0}
# generated tokens per step: dapo's dynamic sampling generates twice as much per step
TOKENS_PER_STEP = {"grpo": 1000.0, "dapo": 2000.0}


def write_run(run_dir, overrides, records, tail=""):
    """A run dir as the trainer and Hydra leave it; tail is appended raw (e.g. a truncated line)."""
    (run_dir / ".hydra").mkdir(parents=True)
    (run_dir / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    (run_dir / ".hydra" / "config.yaml").write_text("seed: 0\n")
    if records is not None:
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records) + tail)


def training_records(algorithm, seed):
    records = []
    for step in range(1, 5):
        record = {
            "step": step,
            "time/elapsed_s": step * SECONDS_PER_STEP[algorithm],
            "tokens/generated": TOKENS_PER_STEP[algorithm],
            "tokens/generated_total": step * TOKENS_PER_STEP[algorithm],
            "reward/mean": 0.1 * step + 0.05 * seed,
            "accuracy/drawn": 0.1 * step,
            "accuracy": 0.2 * step,
            "entropy/mean": 1.0 - 0.1 * step - 0.02 * seed,
            "response_length/mean": 200.0 + 10 * step + seed,
            "clip/low_frac": 0.01 * step,
            "clip/high_frac": 0.02 * step,
            "kl/ref": 0.001 * step * (seed + 1),
        }
        if algorithm == "grpo":
            record["kl/old"] = 0.0005 * step
        if step in (2, 4):
            record["eval/accuracy"] = EVAL_ACCURACY[(algorithm, seed)][step // 2 - 1]
        records.append(record)
    return records


def build_multirun(root):
    """grpo and dapo x seeds 0-2 (subdirs 0-5); dapo seed 2 ends in a truncated line; subdir 6 (gtpo) has no metrics."""
    for index, (algorithm, seed) in enumerate(EVAL_ACCURACY):
        tail = '{"step": 5, "reward/me' if (algorithm, seed) == ("dapo", 2) else ""
        overrides = [f"algorithm={algorithm}", f"seed={seed}", "trainer.max_steps=4"]
        write_run(root / str(index), overrides, training_records(algorithm, seed), tail)
    write_run(root / "6", ["algorithm=gtpo", "seed=0", "trainer.max_steps=4"], None)
    (root / "multirun.yaml").write_text("hydra: {}\n")
    return root


@pytest.fixture
def out_of():
    """compare_dir, for the test modules (test files cannot import conftest by name)."""
    return compare_dir


@pytest.fixture
def run_writer():
    """write_run, for test modules that lay out runs of their own (test files cannot import conftest by name)."""
    return write_run


@pytest.fixture
def multirun(tmp_path):
    return build_multirun(tmp_path / "multirun")


def fake_wandb(calls):
    """Stands in for the wandb module and records what the comparison logs."""

    class FakeRun:
        def log(self, data):
            calls["log"] = data

        def finish(self):
            calls["finished"] = True

    def init(**kwargs):
        calls["init"] = kwargs
        return FakeRun()

    return types.SimpleNamespace(
        init=init, Table=lambda columns, data: ("table", columns, data), Image=lambda path: ("image", path)
    )


@pytest.fixture(scope="session")
def compared(tmp_path_factory):
    """One full CLI run over the multirun (plotting is the slow part): (multirun dir, stdout, exit code, wandb calls)."""
    root = build_multirun(tmp_path_factory.mktemp("compared") / "multirun")
    calls, stdout = {}, io.StringIO()
    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(stdout):
        patch.setitem(sys.modules, "wandb", fake_wandb(calls))
        patch.chdir(root.parent)  # the default output dir is under the current directory
        code = main([str(root), "--baseline", "algorithm=grpo", "--wandb", "--wandb-project", "proj"])
    return root, stdout.getvalue(), code, calls


def compare_dir(root):
    """Where a comparison of the multirun `root` run from its parent folder writes by default."""
    return root.parent / "outputs" / "compare" / root.name

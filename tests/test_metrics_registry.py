"""One metrics registry (issue 42, trap 5): every key a run logs has an entry (what, over which rows, when), the
docs' glossary is generated from it, and each entry's rule says when a run logs it: dynamic_sampling/* only with
dynamic sampling on."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from support.config import SMALL, train_config
from support.env import REPO, cli_env
from tokenpo.metrics_registry import EVAL, EVERY, METRICS, STEP, entry, glossary

DOCS = REPO / "docs" / "metrics.md"


def test_the_glossary_page_is_generated_from_the_registry():
    assert DOCS.read_text() == glossary(), "docs/metrics.md is stale: python -m tokenpo.metrics_registry > it"
    for metric in METRICS:
        assert f"| `{metric.key}` |" in DOCS.read_text()


def test_every_entry_says_what_over_which_rows_and_when():
    for metric in METRICS:
        assert metric.definition.endswith(".") and metric.rows and metric.when and metric.kind in (STEP, EVERY, EVAL)
    assert len({metric.key for metric in METRICS}) == len(METRICS)
    # an entry is reached by its own key form: none hides behind an earlier pattern
    examples = {"<bench>": "arith", "<polarity>": "pos", "<k>": "4", "<n>": "4", "<lag>": "1",
                "<detector>": "entropy", "<verdict>": "wrong"}
    for metric in METRICS:
        key = metric.key
        for placeholder, value in examples.items():
            key = key.replace(placeholder, value)
        assert entry(key) is metric, key


def test_every_key_the_committed_runs_logged_has_an_entry():
    paths = sorted((REPO / "docs").rglob("metrics.jsonl"))
    assert paths
    keys = {key for path in paths for line in path.read_text().splitlines() if line.strip()
            for key in json.loads(line)}
    assert [key for key in sorted(keys) if entry(key) is None] == []


def test_rules_read_the_run_config():
    by_key = {metric.key: metric for metric in METRICS}
    grpo, dapo = train_config("model=tiny"), train_config("model=tiny", "algorithm=dapo")
    assert by_key["dynamic_sampling/rounds"].rule(grpo) is False
    assert by_key["dynamic_sampling/rounds"].rule(dapo) is True
    assert by_key["kl/ref"].rule(grpo) is True and by_key["kl/ref"].rule(dapo) is False
    assert by_key["timing/old_logprob_s"].rule(train_config("model=tiny", "trainer.mini_batches=2")) is True
    assert by_key["tepo/mask_frac"].rule(train_config("model=tiny", "algorithm=tepo")) is True


RUNS = {"grpo": [], "dapo": ["algorithm=dapo"], "tepo": ["algorithm=tepo", "trainer.mini_batches=2"],
        "gmpo": ["algorithm=gmpo", "eval.n=2", "eval.pass_k=[1,2]", "eval.temperature=1.0"]}


@pytest.fixture(scope="module")
def logged(tmp_path_factory) -> dict[str, tuple[list[dict], list[str]]]:
    """{run: (its metrics.jsonl records, its overrides)}: tiny runs of 2 steps, evaluated at steps 0, 1 and 2."""
    root = tmp_path_factory.mktemp("registry")
    common = [*SMALL, "trainer.max_steps=2", "eval.every_steps=1"]
    procs = {name: subprocess.Popen([sys.executable, "-m", "tokenpo.train", *common, *extra,
                                     f"hydra.run.dir={root / name}"], cwd=REPO, env=cli_env(),
                                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
             for name, extra in RUNS.items()}
    out = {}
    for name, proc in procs.items():
        _, stderr = proc.communicate(timeout=600)
        assert proc.returncode == 0, stderr[-3000:]
        records = [json.loads(line) for line in (root / name / "metrics.jsonl").read_text().splitlines()]
        out[name] = (records, [*common, *RUNS[name]])
    return out


@pytest.mark.e2e
@pytest.mark.parametrize("name", list(RUNS))
def test_every_logged_key_has_an_entry_whose_rule_holds(logged, name):
    records, overrides = logged[name]
    cfg = train_config(*overrides)
    assert [record["step"] for record in records] == [0, 1, 2]
    for record in records:
        for key in record:
            metric = entry(key)
            assert metric is not None, f"{key} is logged but has no entry in tokenpo/metrics_registry.py"
            if record["step"] == 0:
                assert metric.kind in (EVAL, EVERY), key
            assert metric.rule(cfg) is not False, f"{key}: its entry says a {name} run does not log it"
    steps = [record for record in records if record["step"] > 0]
    for metric in METRICS:
        if metric.kind == STEP and metric.rule(cfg) is True:
            assert all(any(metric.pattern.match(key) for key in record) for record in steps), metric.key
    dynamic = [key for record in records for key in record if key.startswith("dynamic_sampling/")]
    assert bool(dynamic) == cfg.algorithm.dynamic_sampling.enabled

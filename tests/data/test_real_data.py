"""Loaders on the real benchmark files in ../shared/data (skipped where that folder is absent)."""

import json
from pathlib import Path

import pytest

from tokenpo.data import load_splits

SHARED_DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"

pytestmark = pytest.mark.skipif(not SHARED_DATA.is_dir(), reason=f"real benchmark files absent ({SHARED_DATA})")


@pytest.mark.parametrize(
    "loader, filename, rows, first_answer",
    [
        ("math500", "math500.jsonl", 500, "\\left( 3, \\frac{\\pi}{2} \\right)"),
        ("math", "math500.jsonl", 500, "\\left( 3, \\frac{\\pi}{2} \\right)"),
        ("math", "minerva_math.jsonl", 272, "1.6"),
        ("aime24", "aime24.jsonl", 30, "204"),
        ("aime25", "aime25.jsonl", 30, "70"),
        ("amc23", "amc23.jsonl", 40, "27.0"),
        ("gsm8k", "gsm8k_test.jsonl", 1319, "18"),
    ],
)
def test_eval_benchmarks_load_every_row(make_cfg, loader, filename, rows, first_answer):
    cfg = make_cfg(name=loader, loader=loader, path=str(SHARED_DATA / filename), train_split=None)
    train, held_out = load_splits(cfg, seed=0)
    assert train == [] and len(held_out) == rows
    assert held_out[0].answer == first_answer
    assert all(example.problem and example.answer for example in held_out)


def test_gsm8k_train_and_test_by_split_slot(make_cfg):
    cfg = make_cfg(name="gsm8k", loader="gsm8k", path=str(SHARED_DATA / "gsm8k_{split}.jsonl"))
    train, held_out = load_splits(cfg, seed=0)
    assert (len(train), len(held_out)) == (7473, 1319)
    # every gold answer is a plain number once "####" and thousands separators are gone
    assert all(example.answer.lstrip("-").replace(".", "", 1).isdigit() for example in train + held_out)


def test_math500_boxed_solution_agrees_with_answer_field(make_cfg):
    path = SHARED_DATA / "math500.jsonl"
    cfg = make_cfg(name="m", loader="math", path=str(path), train_split=None, answer_key="solution")
    _, held_out = load_splits(cfg, seed=0)
    answers = [json.loads(line)["answer"] for line in path.read_text().splitlines()]
    assert [example.answer for example in held_out] == answers


@pytest.mark.parametrize("prompt_key", ["problem", "question"])
def test_aime_prompt_key_variants_give_the_same_problems(make_cfg, prompt_key):
    cfg = make_cfg(name="aime24", loader="aime24", path=str(SHARED_DATA / "aime24.jsonl"), train_split=None,
                   prompt_key=prompt_key)
    _, held_out = load_splits(cfg, seed=0)
    assert len(held_out) == 30
    assert held_out[0].problem.startswith("Every morning Aya goes for a $9$-kilometer-long walk")

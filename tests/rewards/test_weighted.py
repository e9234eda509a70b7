"""Your own rewards (issue 42, trap 7): reward.functions, weighted functions of (response, gold, prompt, fields)
returning a float or None, summed into the score the algorithm trains on; the verdict stays the correctness; each
function called once on a sample at start-up; docs/rewards.md's worked example run as written."""

from __future__ import annotations

import importlib
import re
import sys

import pytest
import torch

from support.env import REPO
from tokenpo.algorithms.shaping import shape_rewards
from tokenpo.errors import ConfigError
from tokenpo.rewards import CORRECT, ERROR, GOLD_INVALID, WRONG, Question, RewardConfig, RewardScorer, resolve
from tokenpo.rewards.weighted import (DEFAULT_FUNCTIONS, check_entries, check_user_rewards, load_functions,
                                      weighted_score)

DOCS = REPO / "docs" / "rewards.md"


def scorer_config(*functions: dict, fn: str | None = None) -> RewardConfig:
    return resolve(RewardConfig(fn=fn, functions=list(functions), num_workers=1), {"answer_format": "number"})


def test_the_default_score_is_the_verdict():
    functions = load_functions(DEFAULT_FUNCTIONS)
    assert [weighted_score(functions, v, "r", "1", "p", {}) for v in (CORRECT, WRONG, ERROR, GOLD_INVALID)] == [
        1.0, 0.0, 0.0, None]


def test_weights_sum_what_returned_a_number_and_none_from_all_leaves_the_response_out():
    functions = load_functions([{"fn": "correctness", "weight": 2.0},
                                {"fn": "rewards_user_fns:weighted_half", "weight": 0.5}])
    assert weighted_score(functions, CORRECT, "abcd", "4", "", {}) == pytest.approx(2.0 + 0.5 * 0.5)
    assert weighted_score(functions, GOLD_INVALID, "abcd", "4", "", {}) == pytest.approx(0.25)
    assert weighted_score(functions, GOLD_INVALID, "none", "4", "", {}) is None  # weighted_half: None for "none"


@pytest.mark.parametrize(("entries", "message"), [
    ([], "reward.functions is empty"),
    ([{"fn": "correctness", "weight": "x"}], r"reward.functions\[0\].weight must be a finite number"),
    ([{"fn": "correctness"}, {"fn": "no_colon"}], r"reward.functions\[1\].fn must be correctness or"),
    ([{"fn": "correctness", "wieght": 1}], r"reward.functions\[0\] must be a mapping"),
])
def test_malformed_entries_are_one_line(entries, message):
    with pytest.raises(ConfigError, match=message):
        check_entries(entries)


def test_the_scorer_returns_verdicts_and_scores_with_prompt_and_fields():
    cfg = scorer_config({"fn": "correctness", "weight": 1.0}, {"fn": "rewards_user_fns:reads_fields", "weight": 1.0})
    with RewardScorer(cfg) as scorer:
        judged = scorer.judge([r"\boxed{4}", r"\boxed{5}", "boom"],
                              [Question("4", "2+2?", {"bonus": 0.25}), Question("4", "2+2?", {}),
                               Question("4", "2+2?", {})])
        assert scorer.score([r"\boxed{4}"], ["4"]) == [CORRECT]
    # reads_fields: 'bonus' from the fields, and the prompt's length / 10; raises on "boom"
    assert judged.verdicts == [CORRECT, WRONG, ERROR]
    assert judged.scores == pytest.approx([1 + 0.25 + 0.4, 0 + 0 + 0.4, 0.0])


def test_a_score_maps_onto_the_algorithm_s_reward_scale(load_algorithm):
    dapo = load_algorithm("dapo")  # correct 1, wrong -1
    correct, lengths = torch.tensor([True, False, False]), torch.tensor([4, 4, 4])
    score = torch.tensor([1.0, 0.0, 0.25])
    rewards, _, _ = shape_rewards(dapo, correct, lengths, torch.zeros(3, dtype=torch.bool), torch.zeros(3), 100,
                                  score)
    assert rewards.tolist() == pytest.approx([1.0, -1.0, -0.5])
    plain, _, _ = shape_rewards(dapo, correct, lengths, torch.zeros(3, dtype=torch.bool), torch.zeros(3), 100)
    assert plain.tolist() == [1.0, -1.0, -1.0]


@pytest.mark.parametrize(("fn", "functions", "message"), [
    ("os.path:join", [], "reward.fn: 'os.path:join' failed on the sample: TypeError: reward.fn returned str"),
    (None, [{"fn": "rewards_user_fns:returns_text", "weight": 1}],
     r"reward.functions\[0\].fn: 'rewards_user_fns:returns_text' failed on the sample: TypeError: reward function "
     r"rewards_user_fns:returns_text returned 'yes'"),
    (None, [{"fn": "correctness"}, {"fn": "rewards_user_fns:reads_fields"}],
     r"reward.functions\[1\].fn: .* failed on the sample: KeyError"),
    (None, [{"fn": "rewards_user_fns:exact_match"}], r"must take \(response, gold, prompt, fields\)"),
])
def test_each_function_is_called_once_on_a_sample_at_start_up(fn, functions, message):
    with pytest.raises(ConfigError, match=message):
        check_user_rewards(fn, functions or list(DEFAULT_FUNCTIONS), "2+2?", "4", {}, "the sample", 5.0)
    check_user_rewards(None, [{"fn": "rewards_user_fns:reads_fields"}], "2+2?", "4", {"bonus": 1}, "a sample", 5.0)


def test_a_function_stuck_at_start_up_is_stopped_by_the_timeout():
    with pytest.raises(ConfigError, match="no answer within reward.timeout_s=1 s"):
        check_user_rewards(None, [{"fn": "rewards_user_fns:sleeps", "weight": 1}], "2+2?", "4", {}, "a sample", 1.0)


def docs_example(tmp_path, monkeypatch):
    """docs/rewards.md's my_rewards.py, written out and imported as it is on the page."""
    (code,) = [block for block in re.findall(r"```python\n(.*?)```", DOCS.read_text(), re.S)
               if block.startswith('"""my_rewards.py')]
    (tmp_path / "my_rewards.py").write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("my_rewards", None)
    return importlib.import_module("my_rewards")


def test_the_worked_example_in_the_docs_scores_as_the_page_says(tmp_path, monkeypatch):
    docs_example(tmp_path, monkeypatch)
    (command,) = re.findall(r'python -m tokenpo.train "reward.functions=(\[.*\])"', DOCS.read_text())
    entries = [{"fn": fn, "weight": float(w)} for fn, w in re.findall(r"fn: '?([\w.:]+)'?, weight: ([\d.]+)", command)]
    functions = load_functions(entries)

    def score(response: str, verdict: str) -> float:
        assert len(response) == 40
        return weighted_score(functions, verdict, response, "37", "What is 30 + 7?", {"level": 2})

    assert score(r"The sum of 30 and 7 is \boxed{37}. Done.", CORRECT) == pytest.approx(1.59)
    assert score(r"The sum of 30 and 7 is \boxed{36}. Done.", WRONG) == pytest.approx(0.34)
    assert score("I do not know the answer to this one....", WRONG) == pytest.approx(0.09)
    # the hack-refusing reading: an expression is no answer, however near its value
    assert score(r"The sum of 30 and 7 is \boxed{30 + 7}...", WRONG) == pytest.approx(0.09)
    check_user_rewards(None, entries, "What is 30 + 7?", "37", {"level": 2}, "the first problem", 5.0)

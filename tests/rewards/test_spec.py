"""AnswerSpec: the answer reading a resolved `reward` section gives, and what it finds in a response."""

import pytest

from tokenpo.errors import ConfigError
from tokenpo.rewards import CORRECT, WRONG, AnswerSpec, RewardConfig, answer_spec, judge, resolve


def test_the_defaults_are_the_built_in_reading():
    assert answer_spec(resolve(RewardConfig(), {})) == AnswerSpec()


def test_a_dataset_default_and_the_reward_keys_reach_the_spec():
    reward = resolve(RewardConfig(reasoning_tag=None, timeout_s=2.0, decimal_tolerance=1e-3),
                     {"answer_format": "expression", "answer_pattern": "answer_line", "fallback": "last_number"})
    assert answer_spec(reward) == AnswerSpec(answer_format="expression", answer_pattern="answer_line",
                                             fallback="last_number", reasoning_tag=None, timeout_s=2.0,
                                             decimal_tolerance=1e-3)


def test_an_unresolved_section_is_refused_naming_the_key():
    with pytest.raises(ConfigError, match=r"^reward.fallback is null: pass the config through resolve\(\)"):
        answer_spec(RewardConfig(answer_format="number", answer_pattern="boxed"))


@pytest.mark.parametrize("response, answer, asked", [
    (r"so \boxed{12}", "12", True),
    ("so it is 12", "12", False),  # found by the fallback only
    (r"<think>\boxed{3}</think> it is 12", "12", False),  # the box inside the reasoning is not read
    (r"<think>\boxed{3}", None, False),  # the reasoning never closes
])
def test_answer_and_asked_form_follow_pattern_fallback_and_reasoning_tag(response, answer, asked):
    spec = AnswerSpec(fallback="last_number")
    assert (spec.answer(response), spec.in_asked_form(response)) == (answer, asked)


def test_judge_reads_the_answer_where_the_spec_says():
    response = r"\boxed{3} Answer: 12"
    assert judge(response, "12", AnswerSpec()) == WRONG
    assert judge(response, "12", AnswerSpec(answer_pattern="answer_line")) == CORRECT

"""Loading user reward functions by "module:function" path."""

import operator

import pytest

from tokenpo.errors import ConfigError
from tokenpo.rewards import CORRECT, GOLD_INVALID, WRONG, load_reward_fn
from tokenpo.rewards.user_fn import user_fn_verdict


def test_good_paths_load_the_function():
    assert load_reward_fn("operator:eq") is operator.eq  # a C function of two arguments, bool for an answer
    exact_match = load_reward_fn("rewards_user_fns:exact_match")
    assert exact_match("7", "7") is True


@pytest.mark.parametrize(
    "path, message",
    [("no_colon", "must look like"), ("a:b:c", "must look like"), (":exact_match", "must look like"),
     ("tokenpo.rewards:", "must look like"), ("tokenpo.no_such_module:f", "cannot import module"),
     ("tokenpo.rewards:no_such_fn", "has no attribute"), ("rewards_user_fns:NOT_A_FUNCTION", "not a function"),
     # (fn, response, gold): one argument too many for (response, gold)
     ("tokenpo.rewards.user_fn:user_fn_verdict", r"must take \(response, gold\), its signature is \(fn: ")],
)
def test_bad_paths_raise_config_error_naming_reward_fn(path, message):
    with pytest.raises(ConfigError, match=message) as error:
        load_reward_fn(path)
    assert str(error.value).startswith("reward.fn")
    assert "\n" not in str(error.value)


def test_user_fn_outcomes_map_to_verdicts():
    exact_match = load_reward_fn("rewards_user_fns:exact_match")
    assert user_fn_verdict(exact_match, "7", "7") == CORRECT
    assert user_fn_verdict(exact_match, "8", "7") == WRONG
    assert user_fn_verdict(exact_match, "8", "?") == GOLD_INVALID
    with pytest.raises(TypeError, match="returned float"):
        user_fn_verdict(exact_match, "float", "7")

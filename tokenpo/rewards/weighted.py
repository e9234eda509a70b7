"""Your own rewards: `reward.functions`, a list of weighted reward functions whose sum is a response's score.

Each entry is `{fn: <function>, weight: <number>}`. `fn` is `correctness`, the built-in verdict (the answer read as
reward.answer_* say and checked against the gold by math-verify or as an exact number, or by reward.fn where set): 1
for a correct answer, 0 otherwise, None when the gold cannot be read; or a function of yours named
"package.module:function", called as `fn(response, gold, prompt, fields)` (`fields`: the example's other columns,
data.meta_fields, and its row) that returns a float (partial credit) or None (it cannot judge this response). The
score S of a response is the sum of weight x value over the functions that returned a number; None from all of
them leaves the response out of the loss, as an unreadable gold does. The training reward is
`algorithm.reward.wrong + (algorithm.reward.correct - wrong) x S` (the default list, correctness at weight 1, gives
exactly `correct` or `wrong`); correctness (accuracy, the held-out evaluation, DAPO's mixed groups, GTPO's
polarities) stays the verdict. A function that raises or returns anything else makes the response's verdict
`error` (reward/error_frac). docs/rewards.md works an example through.

Light on purpose (no torch): the scoring worker processes import it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tokenpo.errors import ConfigError
from tokenpo.rewards.verdicts import CORRECT, GOLD_INVALID

CORRECTNESS = "correctness"
DEFAULT_FUNCTIONS = ({"fn": CORRECTNESS, "weight": 1.0},)
ENTRY_KEYS = ("fn", "weight")
ARGUMENTS = ("response", "gold", "prompt", "fields")

UserReward = Callable[[str, str, str, dict], "float | None"]


@dataclass(frozen=True)
class RewardFunction:
    """One entry of reward.functions, its function imported (None: the built-in correctness)."""

    name: str  # "correctness" or "package.module:function"
    weight: float
    fn: UserReward | None = None

    def value(self, verdict: str, response: str, gold: str, prompt: str, fields: dict) -> float | None:
        if self.fn is None:
            return None if verdict == GOLD_INVALID else float(verdict == CORRECT)
        return reward_value(self.name, self.fn(response, gold, prompt, fields))


def entry_problem(index: int, entry: Any) -> str | None:
    """Why reward.functions[index] is not an entry, or None."""
    key = f"reward.functions[{index}]"
    if not isinstance(entry, Mapping) or set(entry) - set(ENTRY_KEYS) or "fn" not in entry:
        return (f"{key} must be a mapping {{fn: correctness | 'package.module:function', weight: <number>}}, got "
                f"{entry!r}")
    fn, weight = entry["fn"], entry.get("weight", 1.0)
    if not isinstance(fn, str) or (fn != CORRECTNESS and (fn.count(":") != 1 or not all(fn.split(":")))):
        return f"{key}.fn must be correctness or 'package.module:function', got {fn!r}"
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight):
        return f"{key}.weight must be a finite number, got {weight!r}"
    return None


def check_entries(entries: Sequence) -> None:
    """Each entry of reward.functions well formed (one line naming the first that is not), and at least one."""
    if not entries:
        raise ConfigError("reward.functions is empty: list at least one {fn, weight} (the default: "
                          "[{fn: correctness, weight: 1.0}])")
    for index, entry in enumerate(entries):
        problem = entry_problem(index, entry)
        if problem:
            raise ConfigError(problem)


def is_default(entries: Sequence) -> bool:
    """Whether reward.functions is the built-in correctness alone at weight 1 (the score is the verdict)."""
    return [dict(entry) for entry in entries] == [dict(entry) for entry in DEFAULT_FUNCTIONS]


def load_functions(entries: Sequence) -> tuple[RewardFunction, ...]:
    """reward.functions with each user function imported (a one-line ConfigError naming the entry otherwise)."""
    from tokenpo.rewards.user_fn import import_function

    return tuple(RewardFunction(entry["fn"], float(entry.get("weight", 1.0)),
                                None if entry["fn"] == CORRECTNESS else import_function(
                                    entry["fn"], f"reward.functions[{i}].fn", ARGUMENTS))
                 for i, entry in enumerate(entries))


def reward_value(name: str, value: Any) -> float | None:
    """A user function's return value as a float, or None; anything else (a string, NaN) is a bug in it."""
    if value is None:
        return None
    if isinstance(value, (int, float)) and math.isfinite(value):
        return float(value)
    raise TypeError(f"reward function {name} returned {value!r} ({type(value).__name__}), expected a finite float "
                    "or None")


def weighted_score(functions: Sequence[RewardFunction], verdict: str, response: str, gold: str, prompt: str,
                   fields: dict) -> float | None:
    """S = the sum of weight x value over the functions that returned a number; None when none did."""
    values = [(f.weight, f.value(verdict, response, gold, prompt, fields)) for f in functions]
    scored = [weight * value for weight, value in values if value is not None]
    return sum(scored) if scored else None


def sample_response(gold: str) -> str:
    """A response that answers `gold` in the asked-for form, for the start-up call of the user's functions."""
    return f"The answer is \\boxed{{{gold}}}."


def check_user_rewards(fn: str | None, entries: Sequence, problem: str, gold: str, fields: dict, where: str,
                       timeout_s: float) -> None:
    """Start-up: reward.fn and each user function of reward.functions imported and called once on a sample (the
    data's first problem, `where` says which) with a response answering its gold; what raises, hangs past
    `timeout_s` or returns the wrong type stops the run in one line naming the key."""
    from tokenpo.rewards.judging import RewardTimeout, _time_limit
    from tokenpo.rewards.user_fn import check_on_sample, load_reward_fn, user_fn_verdict

    response = sample_response(gold)

    def bounded(call: Callable[[], Any]) -> Callable[[], Any]:
        def run() -> Any:
            try:
                with _time_limit(timeout_s):
                    return call()
            except RewardTimeout:
                raise TimeoutError(f"no answer within reward.timeout_s={timeout_s:g} s") from None
        return run

    if fn is not None:
        verifier = load_reward_fn(fn)
        check_on_sample("reward.fn", fn, bounded(lambda: user_fn_verdict(verifier, response, gold)), lambda _: None,
                        where)
    for index, function in enumerate(load_functions(entries)):
        if function.fn is not None:
            call = bounded(lambda f=function: f.fn(response, gold, problem, dict(fields)))
            check_on_sample(f"reward.functions[{index}].fn", function.name, call,
                            lambda value, name=function.name: reward_value(name, value), where)

"""User-defined reward functions, named in the config as "package.module:function"."""

import importlib
import inspect
from typing import Callable

from tokenpo.errors import ConfigError
from tokenpo.rewards.verdicts import CORRECT, GOLD_INVALID, WRONG

RewardFn = Callable[[str, str], "bool | None"]


def load_reward_fn(path: str) -> RewardFn:
    """Import the callable named by `path` ("package.module:function"): (response, gold) -> True, False or None.

    It is imported by path (not passed as an object) so the scoring worker processes can import it too.
    """
    if not isinstance(path, str) or path.count(":") != 1 or not all(path.split(":")):
        raise ConfigError(f"reward.fn must look like 'package.module:function', got {path!r}")
    module_name, attribute = path.split(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as error:  # a missing module, or one that fails while importing
        reason = f"{type(error).__name__}: {error}"
        raise ConfigError(f"reward.fn: cannot import module {module_name!r} ({reason})") from error
    fn = getattr(module, attribute, None)
    if fn is None:
        raise ConfigError(f"reward.fn: module {module_name!r} has no attribute {attribute!r}")
    if not callable(fn):
        raise ConfigError(f"reward.fn: {path!r} is a {type(fn).__name__}, not a function")
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # some builtins and C callables carry no signature: trusted as they are
        return fn
    try:
        signature.bind("response", "gold")
    except TypeError as error:
        raise ConfigError(f"reward.fn: {path!r} must take (response, gold), its signature is {signature} "
                          f"({error})") from error
    return fn


def user_fn_verdict(fn: RewardFn, response: str, gold: str) -> str:
    """Verdict from a user function's bool | None answer; anything else is a bug in that function."""
    outcome = fn(response, gold)
    if outcome is None:
        return GOLD_INVALID
    if isinstance(outcome, bool):
        return CORRECT if outcome else WRONG
    raise TypeError(f"reward.fn returned {type(outcome).__name__}, expected bool or None")

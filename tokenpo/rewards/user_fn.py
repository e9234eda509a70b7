"""User-defined functions named in the config as "package.module:function": reward.fn, a verifier (response, gold)
-> bool | None, and the entries of reward.functions (tokenpo.rewards.weighted), (response, gold, prompt, fields)
-> float | None. Each is imported by path (not passed as an object) so the scoring worker processes can import it
too, and called once on a sample at start-up (`check_on_sample`), so one that cannot run stops the run there."""

import importlib
import inspect
from typing import Any, Callable

from tokenpo.errors import ConfigError
from tokenpo.rewards.verdicts import CORRECT, GOLD_INVALID, WRONG

RewardFn = Callable[[str, str], "bool | None"]


def import_function(path: str, key: str, arguments: tuple[str, ...] = ()) -> Callable:
    """The callable `path` ("package.module:function") names; `arguments`: names it must accept positionally. A one-line
    ConfigError naming `key` otherwise."""
    if not isinstance(path, str) or path.count(":") != 1 or not all(path.split(":")):
        raise ConfigError(f"{key} must look like 'package.module:function', got {path!r}")
    module_name, attribute = path.split(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as error:  # a missing module, or one that fails while importing
        reason = f"{type(error).__name__}: {error}"
        raise ConfigError(f"{key}: cannot import module {module_name!r} ({reason})") from error
    fn = getattr(module, attribute, None)
    if fn is None:
        raise ConfigError(f"{key}: module {module_name!r} has no attribute {attribute!r}")
    if not callable(fn):
        raise ConfigError(f"{key}: {path!r} is a {type(fn).__name__}, not a function")
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # some builtins and C callables carry no signature: trusted as they are
        return fn
    try:
        signature.bind(*arguments)
    except TypeError as error:
        raise ConfigError(f"{key}: {path!r} must take ({', '.join(arguments)}), its signature is {signature} "
                          f"({error})") from error
    return fn


def load_reward_fn(path: str) -> RewardFn:
    """Import reward.fn: (response, gold) -> True, False or None."""
    return import_function(path, "reward.fn", ("response", "gold"))


def user_fn_verdict(fn: RewardFn, response: str, gold: str) -> str:
    """Verdict from a user function's bool | None answer; anything else is a bug in that function."""
    outcome = fn(response, gold)
    if outcome is None:
        return GOLD_INVALID
    if isinstance(outcome, bool):
        return CORRECT if outcome else WRONG
    raise TypeError(f"reward.fn returned {type(outcome).__name__}, expected bool or None")


def check_on_sample(key: str, path: str, call: Callable[[], Any], check: Callable[[Any], Any], where: str) -> None:
    """`call()` (the function on a sample), its result through `check`; what either raises as one line naming `key`
    and the sample (`where`)."""
    try:
        check(call())
    except Exception as error:  # the user's code: anything it raises is the user's to see in one line
        detail = " ".join(str(error).split())[:200]
        raise ConfigError(f"{key}: {path!r} failed on {where}: {type(error).__name__}: {detail}") from error

"""User reward functions for the tests, imported by path ("rewards_user_fns:name") in the worker processes."""

import sys
import time

NOT_A_FUNCTION = 3


def exact_match(response, gold):
    """Plain string equality; raises on "boom" and returns a float for "float" to exercise error handling."""
    if response == "boom":
        raise ZeroDivisionError("boom")
    if response == "float":
        return 0.5
    if gold == "?":
        return None
    return response.strip() == gold


def stuck_on_hang(response, gold):
    """Never returns for the response "hang": a C-level loop that no signal can interrupt."""
    if response == "hang":
        sum(range(10**18))
    return response == gold


def main_module_reimported(response, gold):
    """True in a worker that re-ran the parent's main script spawn_main_script.py (it defines the marker)."""
    return hasattr(sys.modules["__main__"], "SPAWN_MAIN_SCRIPT_MARKER")


def slow_when_asked(response, gold):
    """Exact match that takes half a second for a response starting with "slow"."""
    if response.startswith("slow"):
        time.sleep(0.5)
    return response == gold


def weighted_half(response, gold, prompt, fields):
    """A reward.functions entry: 0.5 for any response, None for the response "none"."""
    return None if response == "none" else 0.5


def reads_fields(response, gold, prompt, fields):
    """The field 'bonus' (a KeyError without it, on purpose) plus the prompt's length / 10; raises on "boom"."""
    if response == "boom":
        raise RuntimeError("boom")
    return fields["bonus"] + len(prompt) / 10 if response != r"\boxed{5}" else len(prompt) / 10


def returns_text(response, gold, prompt, fields):
    return "yes"


def sleeps(response, gold, prompt, fields):
    time.sleep(30)
    return 1.0

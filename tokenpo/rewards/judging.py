"""Judge one response against its gold answer: exact numeric literals, or math-verify equivalence."""

import functools
import logging
import re
import signal
import threading
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Iterator

from tokenpo.rewards.extract import ANSWER_FORMATS, extract_answer
from tokenpo.rewards.latex import BOX_OPEN_RE
from tokenpo.rewards.numbers import parse_answer_number, parse_gold_number
from tokenpo.rewards.prose import hedged
from tokenpo.rewards.spec import AnswerSpec
from tokenpo.rewards.verdicts import (
    CORRECT,
    FORMAT_REJECTED,
    GOLD_INVALID,
    NO_ANSWER,
    TIMEOUT,
    WRONG,
)

_UNESCAPED_DOLLAR_RE = re.compile(r"(?<!\\)\$")
# math-verify's own timeouts are off (they are whole-second alarms that would cancel _time_limit's timer),
# and it warns once per process that they are; _time_limit is the timeout it asks its caller to provide.
for _name in ("math_verify.parser", "math_verify.grader"):
    logging.getLogger(_name).addFilter(lambda record: not record.getMessage().startswith("Timeout is disabled"))


def resolve_answer_format(answer_format: str, gold: str) -> str:
    """`number` or `expression`; `auto` means `number` when the gold is a bare numeric literal."""
    if answer_format not in ANSWER_FORMATS:
        raise ValueError(f"unknown answer_format {answer_format!r}; known: {', '.join(ANSWER_FORMATS)}")
    if answer_format != "auto":
        return answer_format
    return "number" if parse_gold_number(gold) is not None else "expression"


class RewardTimeout(BaseException):
    """The time budget of one response is spent: a BaseException, so the `except Exception` around math-verify's
    calls lets it through."""


@functools.cache
def expression_libraries() -> SimpleNamespace:
    """math-verify and sympy, imported with the first expression answer, before its timer starts (a second or more:
    numeric answers, config checks and a scoring worker's start need neither)."""
    import math_verify
    import sympy

    return SimpleNamespace(parse=math_verify.parse, equal=math_verify.verify, Float=sympy.Float,
                           Rational=sympy.Rational, Tuple=sympy.Tuple)


def _raise_timeout(signum, frame) -> None:
    raise RewardTimeout("reward time budget spent")


@contextmanager
def _time_limit(seconds: float) -> Iterator[None]:
    """Raise RewardTimeout in the block once it has run `seconds`, to the millisecond.

    A SIGALRM interval timer works only in a process's main thread; elsewhere the block runs unbounded
    and only the worker pool's kill protects the caller. Code stuck inside C (sympy, huge integers)
    never sees the signal either: the pool kills that worker.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous_handler = signal.signal(signal.SIGALRM, _raise_timeout)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous_handler)


def _math_verify_parse(text: str) -> list:
    """Sympy readings of `text`; math-verify's raw-string fallback is off, so an unreadable gold is invalid."""
    # math-verify finds LaTeX only between delimiters, so a plain gold such as \frac{\pi}{2} gets `$...$`
    latex = text if _UNESCAPED_DOLLAR_RE.search(text) or "\\boxed" in text else f"${text}$"
    try:
        return expression_libraries().parse(latex, fallback_mode="no_fallback", parsing_timeout=None,
                                            raise_on_error=True)
    except Exception:  # input math-verify cannot read is "nothing parsed"; RewardTimeout passes through
        return []


def _number_verdict(answer: str | None, gold: str) -> str:
    gold_value = parse_gold_number(gold)
    if gold_value is None:
        return GOLD_INVALID
    if answer is None:
        return NO_ANSWER
    value = parse_answer_number(answer)
    if value is None:
        return FORMAT_REJECTED
    return CORRECT if value == gold_value else WRONG


def _exact_decimals(expr):
    """`expr` with each decimal literal replaced by the fraction it writes (0.333333 -> 333333/1000000)."""
    lib = expression_libraries()
    return expr.xreplace({f: lib.Rational(str(f)) for f in expr.atoms(lib.Float)})


def _within(gold, answer, tolerance: float) -> bool:
    """True if `answer` is a number (or a tuple of them) within `tolerance` of `gold`'s, entry by entry."""
    if isinstance(gold, expression_libraries().Tuple) and isinstance(answer, expression_libraries().Tuple):
        return len(gold) == len(answer) and all(_within(g, a, tolerance) for g, a in zip(gold, answer))
    difference = (gold - answer).evalf() if getattr(gold, "is_number", False) and answer.is_number else None
    return difference is not None and difference.is_real is True and abs(difference) <= tolerance


def _pair_matches(gold_item, answer_item, decimal_tolerance: float | None) -> bool:
    """math-verify equivalence, except that a decimal answer meets an exact gold (no decimals) only exactly.

    math-verify rounds floats to 6 places, so 0.333333 would match 1/3 and 1.414214 would match sqrt(2): a rounded
    decimal a policy can learn in place of the exact answer. Here the answer's decimals are read as the fractions
    they write (0.5 is 1/2 and still matches), unless `decimal_tolerance` (> 0) accepts a number that close.
    """
    lib = expression_libraries()
    exact_gold = hasattr(gold_item, "atoms") and not gold_item.atoms(lib.Float)
    if not (exact_gold and hasattr(answer_item, "atoms") and answer_item.atoms(lib.Float)):
        return lib.equal(gold_item, answer_item, timeout_seconds=None, raise_on_error=True)
    exact_answer = _exact_decimals(answer_item)
    if lib.equal(gold_item, exact_answer, timeout_seconds=None, raise_on_error=True):
        return True
    return bool(decimal_tolerance) and _within(gold_item, exact_answer, decimal_tolerance)


def _expression_verdict(answer: str | None, gold: str, decimal_tolerance: float | None = None) -> str:
    gold_parsed = _math_verify_parse(gold)
    if not gold_parsed:
        return GOLD_INVALID
    if answer is None:
        return NO_ANSWER
    if hedged(answer):
        return FORMAT_REJECTED
    # a box inside the answer becomes a plain group, so math-verify reads the whole answer, not the inner box
    answer_parsed = _math_verify_parse(BOX_OPEN_RE.sub("{", answer))
    for gold_item in gold_parsed:
        for answer_item in answer_parsed:
            # one pair at a time, so a pair that errors does not hide a later pair that matches
            try:
                if _pair_matches(gold_item, answer_item, decimal_tolerance):
                    return CORRECT
            except Exception:
                continue
    return WRONG


def judge(response: str, gold: str, spec: AnswerSpec) -> str:
    """Verdict (see tokenpo.rewards.verdicts) on `response`'s final answer against `gold`, read as `spec` says.

    Only `response` is read, only after its last `</reasoning_tag>`, and only at `answer_pattern` (else
    `fallback`). `timeout_s` bounds math-verify's work in the main thread; in other threads use
    RewardScorer for a hard limit. Under `expression`, a decimal answer matches an exact gold (1/3, sqrt(2), pi)
    only when it equals it (0.5 for 1/2), or when it lies within `decimal_tolerance` of it (null/0 = exact only).
    """
    if not isinstance(response, str):
        raise TypeError(f"response must be a str, got {type(response).__name__}")
    if isinstance(gold, (int, float)) and not isinstance(gold, bool):
        gold = str(gold)  # data files store some answers as numbers (amc23: 27.0)
    if not isinstance(gold, str) or not gold.strip():
        return GOLD_INVALID
    answer_format = resolve_answer_format(spec.answer_format, gold)
    answer = spec.answer(response)
    if answer_format == "number":
        return _number_verdict(answer, gold)
    expression_libraries()  # imported outside the time budget
    try:
        with _time_limit(spec.timeout_s):
            return _expression_verdict(answer, gold, spec.decimal_tolerance)
    except RewardTimeout:
        return TIMEOUT


def format_reward(
    response: str, answer_pattern: str, *, require_number: bool = False, reasoning_tag: str | None = "think"
) -> float:
    """1.0 if the asked-for answer form is present after the reasoning (holding a numeric literal when
    `require_number`), else 0.0.

    Fallbacks never count here: this reward exists to teach the asked-for form.
    """
    answer = extract_answer(response, answer_pattern, "none", reasoning_tag)
    if answer is None or (require_number and parse_answer_number(answer) is None):
        return 0.0
    return 1.0

"""Answer extraction and numeric-literal parsing, checked against hand-written expectations."""

from fractions import Fraction

import pytest

from tokenpo.rewards import extract_answer, parse_answer_number, parse_gold_number
from tokenpo.rewards.extract import after_reasoning, answer_line, last_boxed, last_dollar, last_number


@pytest.mark.parametrize(
    "text, expected",
    [(r"\boxed{\frac{1}{\sqrt{4}}}", r"\frac{1}{\sqrt{4}}"), (r"\boxed{\{1,2\}}", r"\{1,2\}"),
     (r"\boxed{1} and \boxed {2}", "2"), (r"\fbox{3}", "3"), (r"\boxed{1} then \boxed{2", None),
     ("no box", None), (r"\boxed{}", ""),
     # the last outermost box, whole: an inner box is part of it, and an unclosed outer box hides any inner one
     (r"\boxed{70 \text{ or } \boxed{69}}", r"70 \text{ or } \boxed{69}"), (r"\boxed{70, \fbox{69}}", r"70, \fbox{69}"),
     (r"\boxed{1} \boxed{2 \boxed{3}} end", r"2 \boxed{3}"), (r"\boxed{1 \boxed{2}", None)],
)
def test_last_boxed_balances_braces(text, expected):
    assert last_boxed(text) == expected


@pytest.mark.parametrize(
    "text, expected",
    [("so 10-3 is 7.", "7"), ("x = \\frac{3}{4}", r"\frac{3}{4}"), ("1,000 and then 2.5", "2.5"),
     ("it fell to -3", "-3"), ("The result: 1,000.", "1,000"), ("50% of them", r"50\%"), ("none", None)],
)
def test_last_number(text, expected):
    assert last_number(text) == expected


@pytest.mark.parametrize(
    "text, expected",
    [("$a$ and $$b$$ and $c", "b"), (r"costs \$5, so $x$", "x"), ("no math", None), ("$unclosed", None)],
)
def test_last_dollar_skips_escaped_and_unclosed(text, expected):
    assert last_dollar(text) == expected


def test_answer_line_takes_the_last_and_strips_bold():
    assert answer_line("Answer: 1\n**Final Answer:** 2 \nbye") == "2"
    assert answer_line("The answer is 3") is None


@pytest.mark.parametrize(
    "text, tag, expected",
    [("<think>a</think>b", "think", "b"), ("<think>a</think>b<think>c</think> d", "think", " d"),
     ("opened in the prompt</think>b", "think", "b"), ("<think>a", "think", None),
     ("<think>a</think>b<think>c", "think", None), ("no tags", "think", "no tags"),
     ("<think>a</think>b", None, "<think>a</think>b"), ("<r>a</r>b<think>", "r", "b<think>")],
)
def test_after_reasoning(text, tag, expected):
    assert after_reasoning(text, tag) == expected


def test_extract_answer_falls_back_only_without_the_asked_for_form():
    assert extract_answer(r"1 then \boxed{2} then 3", "boxed", "last_number") == "2"
    assert extract_answer(r"1 then \boxed{} then 3", "boxed", "last_number") == "3"
    assert extract_answer("1 then 3", "boxed", "none") is None


@pytest.mark.parametrize(
    "answer, expected",
    [("69", Fraction(69)), ("69.0", Fraction(69)), ("-3", Fraction(-3)), ("+3", Fraction(3)),
     ("1,000", Fraction(1000)), ("2.50", Fraction(5, 2)), (".5", Fraction(1, 2)),
     (r"-\frac{1}{2}", Fraction(-1, 2)), (r"\frac{-1}{2}", Fraction(-1, 2)),
     (r"\tfrac34", Fraction(3, 4)), ("3 / 4", Fraction(3, 4)), (r"90^\circ", Fraction(90)), ("x = 5", Fraction(5)),
     (r"\text{\textbf{7}}", Fraction(7)), ("69 or 70", None), ("1,0000", None), ("15 + 54", None), ("6/3", None),
     ("1/0", None), (r"\sqrt{4}", None), ("2^3", None), ("", None),
     # only units beside the literal (issue 13 item 10)
     ("5 cm", Fraction(5)), ("5 km/h", Fraction(5)), (r"5\text{ square feet}", Fraction(5)),
     (r"\$18.90", Fraction(189, 10)), (r"10\%", Fraction(10)), ("10 percent", Fraction(10)), ("69.", Fraction(69)),
     ("not 69", None), ("69 is wrong", None),
     ("less than 69", None), ("69 or seventy", None), ("5 apples", None), ("= 5", None), ("total = 5", None),
     # thousands separators must group correctly
     (r"1,\!000", Fraction(1000)), ("1,069", Fraction(1069)), ("12,345.5", Fraction(24691, 2)), ("0,069", None),
     ("1234,567", None), ("069", Fraction(69))],
)
def test_parse_answer_number(answer, expected):
    assert parse_answer_number(answer) == expected


@pytest.mark.parametrize(
    "gold, expected",
    [("27.0", Fraction(27)), (r"\$18", Fraction(18)), ("6/3", Fraction(2)), ("5 apples", None), ("2x", None),
     ("0,069", None)],
)
def test_parse_gold_number_accepts_only_bare_literals(gold, expected):
    assert parse_gold_number(gold) == expected

"""Golden cases for the answer check, run through the real math-verify (no mocks)."""

import pytest

from tokenpo.rewards import (
    CORRECT,
    FORMAT_REJECTED,
    GOLD_INVALID,
    NO_ANSWER,
    WRONG,
    AnswerSpec,
    format_reward,
    judge,
    resolve_answer_format,
)

NUMBER = {"answer_format": "number"}
EXPRESSION = {"answer_format": "expression"}
LAST_NUMBER = {"fallback": "last_number"}
LAST_DOLLAR = {"fallback": "last_dollar"}
ANSWER_LINE = {"answer_pattern": "answer_line"}

# (response, gold, AnswerSpec fields, expected verdict)
GOLDEN = [
    # fractions vs decimals, compared exactly
    (r"\boxed{\frac{1}{2}}", "0.5", {}, CORRECT),
    (r"\boxed{0.5}", r"\frac{1}{2}", {}, CORRECT),
    (r"\boxed{\frac12}", "1/2", {}, CORRECT),
    (r"\boxed{\dfrac{3}{4}}", "0.75", {}, CORRECT),
    (r"\boxed{3/4}", "0.75", {}, CORRECT),
    (r"\boxed{2.5}", "5/2", {}, CORRECT),
    (r"\boxed{0.33}", "1/3", {}, WRONG),
    # a fraction must be in lowest terms, or "What is 84 / 7?" could be answered by echoing it
    (r"\boxed{\frac{2}{4}}", "0.5", {}, FORMAT_REJECTED),
    (r"What is 84 / 7? \boxed{84/7}", "12", {}, FORMAT_REJECTED),
    # LaTeX vs plain, through math-verify
    (r"The answer is $\boxed{\frac{\pi}{2}}$", r"\frac{\pi}{2}", {}, CORRECT),
    (r"\boxed{\pi/2}", r"\frac{\pi}{2}", {}, CORRECT),
    (r"\boxed{\frac{\sqrt{2}}{2}}", r"\frac{1}{\sqrt{2}}", {}, CORRECT),
    (r"\boxed{2x+1}", "1+2x", {}, CORRECT),
    (r"\boxed{\frac{1}{\sqrt{4}}}", "1/2", EXPRESSION, CORRECT),
    # units and text around the answer
    (r"\boxed{5 \text{ dollars}}", "5", {}, CORRECT),
    (r"\boxed{\$5}", "5", {}, CORRECT),
    ("The rope is 5 cm long", "5", LAST_NUMBER, CORRECT),
    (r"\boxed{5\text{ cm}^2}", "5", {}, CORRECT),
    (r"\boxed{x = 5}", "5", {}, CORRECT),
    (r"\boxed{6 cm}", "5", {}, WRONG),
    # only unit words may stand beside the number
    (r"\boxed{5 apples}", "5", {}, FORMAT_REJECTED),
    # several boxes: the last one is the answer
    (r"First \boxed{3}, no wait, \boxed{4}", "4", {}, CORRECT),
    (r"First \boxed{3}, no wait, \boxed{4}", "3", {}, WRONG),
    (r"\fbox{7}", "7", {}, CORRECT),
    (r"\boxed{7", "7", {}, NO_ANSWER),
    # no box: each fallback
    ("so the result is 69.", "69", {}, NO_ANSWER),
    ("so the result is 69.", "69", LAST_NUMBER, CORRECT),
    ("so the result is $69$.", "69", LAST_DOLLAR, CORRECT),
    ("no numbers here", "69", LAST_NUMBER, NO_ANSWER),
    ("the sum is $15 + 54$", "69", LAST_DOLLAR, FORMAT_REJECTED),
    # empty response; an answer that is only in the prompt is never seen
    ("", "69", {}, NO_ANSWER),
    ("", "69", LAST_NUMBER, NO_ANSWER),
    ("Let me think step by step about the question.", "69", LAST_NUMBER, NO_ANSWER),
    # the echoed question: wrong as a number, right as an expression
    ("15 + 54", "69", {**NUMBER, **LAST_NUMBER}, WRONG),
    (r"\boxed{15+54}", "69", NUMBER, FORMAT_REJECTED),
    (r"\boxed{15+54}", "69", {}, FORMAT_REJECTED),
    (r"\boxed{15+54}", "69", EXPRESSION, CORRECT),
    ("$15 + 54$", "69", {**EXPRESSION, **LAST_DOLLAR}, CORRECT),
    (r"\boxed{69 or 70}", "69", {}, FORMAT_REJECTED),
    # numeric literal forms under number
    ("69", "69", LAST_NUMBER, CORRECT),
    (r"\boxed{69.0}", "69", NUMBER, CORRECT),
    (r"\boxed{69}", "69", NUMBER, CORRECT),
    ("$69$", "69", {**NUMBER, **LAST_DOLLAR}, CORRECT),
    (r"\boxed{1,000}", "1000", {}, CORRECT),
    ("The total is 1,000.", "1000", LAST_NUMBER, CORRECT),
    (r"\boxed{1{,}000}", "1000", {}, CORRECT),
    (r"\boxed{-3}", "-3", {}, CORRECT),
    ("\\boxed{\u22123}", "-3", {}, CORRECT),
    ("It drops to \u22123 degrees", "-3", LAST_NUMBER, CORRECT),
    (r"\boxed{3}", "-3", {}, WRONG),
    # percentages: the sign is dropped on both sides
    (r"\boxed{50\%}", "50", {}, CORRECT),
    ("about 25% of them", "25", LAST_NUMBER, CORRECT),
    (r"\boxed{50\%}", r"50\%", {}, CORRECT),
    (r"\boxed{0.5}", r"50\%", {}, WRONG),
    # intervals, sets (expression)
    (r"\boxed{(1, 2]}", "(1,2]", {}, CORRECT),
    (r"\boxed{[1, 2]}", "(1,2]", {}, WRONG),
    (r"\boxed{[0, \infty)}", r"[0,\infty)", {}, CORRECT),
    (r"\boxed{(-\infty, 3) \cup (4, \infty)}", r"(-\infty,3)\cup(4,\infty)", {}, CORRECT),
    (r"\boxed{\{3, 1, 2\}}", r"\{1,2,3\}", {}, CORRECT),
    # gold written as a decimal, or stored as a float (amc23)
    (r"\boxed{27}", "27.0", {}, CORRECT),
    (r"\boxed{27}", 27.0, {}, CORRECT),
    # gold that cannot be parsed
    (r"\boxed{5}", "\\frac{", {}, GOLD_INVALID),
    (r"\boxed{5}", "", {}, GOLD_INVALID),
    (r"\boxed{5}", "12 apples", NUMBER, GOLD_INVALID),
    # DAPO's "Answer:" line
    ("Let me compute.\nAnswer: 42", "42", ANSWER_LINE, CORRECT),
    ("Answer: 41\nActually no.\nAnswer: 42", "42", ANSWER_LINE, CORRECT),
    ("**Answer:** $42$", "42", ANSWER_LINE, CORRECT),
    (r"\boxed{42}", "42", ANSWER_LINE, NO_ANSWER),
    ("Answer: 40 + 2", "42", ANSWER_LINE, FORMAT_REJECTED),
    # issue 13 item 10: non-answers a strict grader refuses; words around the number
    (r"\boxed{not 69}", "69", {}, FORMAT_REJECTED),
    (r"\boxed{69 is wrong}", "69", {}, FORMAT_REJECTED),
    (r"\boxed{less than 69}", "69", {}, FORMAT_REJECTED),
    (r"\boxed{69 or seventy}", "69", {}, FORMAT_REJECTED),
    (r"\boxed{69 is wrong}", "69", EXPRESSION, FORMAT_REJECTED),
    # a box inside the last outermost box is part of that answer
    (r"\boxed{70 \text{ or } \boxed{69}}", "69", {}, FORMAT_REJECTED),
    (r"\boxed{70 \text{ or } \boxed{69}}", "69", EXPRESSION, FORMAT_REJECTED),
    (r"\boxed{70, \fbox{69}}", "69", {}, FORMAT_REJECTED),
    (r"\boxed{70, \fbox{69}}", "69", EXPRESSION, WRONG),
    (r"\boxed{\boxed{69}}", "69", EXPRESSION, CORRECT),
    # thousands separators must group correctly
    (r"\boxed{0,069}", "69", {}, FORMAT_REJECTED),
    ("so it is 0,069", "69", LAST_NUMBER, FORMAT_REJECTED),
    (r"\boxed{1,069}", "1069", {}, CORRECT),
    (r"\boxed{069}", "69", {}, CORRECT),  # AIME answers are written with three digits
    # only the text after the last reasoning block is scored; an unclosed block has no answer yet
    (r"<think>so \boxed{69}</think> The answer is 70.", "69", {}, NO_ANSWER),
    (r"<think>so \boxed{69}</think> The answer is 70.", "69", LAST_NUMBER, WRONG),
    (r"<think>so \boxed{69}</think> The answer is 70.", "69", {"reasoning_tag": None}, CORRECT),
    (r"<think>maybe \boxed{70}</think> so \boxed{69}", "69", {}, CORRECT),
    (r"opened by the chat template \boxed{70}</think> \boxed{69}", "69", {}, CORRECT),
    (r"<think>so \boxed{69}", "69", LAST_NUMBER, NO_ANSWER),
    (r"<reasoning>\boxed{69}</reasoning>70", "69", {"reasoning_tag": "reasoning", **LAST_NUMBER}, WRONG),
    # prose beside an expression's math may only name its unit: math-verify drops it and pays the 69
    (r"\boxed{69 \text{ (or 70)}}", "69", EXPRESSION, FORMAT_REJECTED),
    (r"\boxed{69 \text{ (maybe seventy)}}", "69", EXPRESSION, FORMAT_REJECTED),
    (r"\boxed{69 \text{ is wrong}}", "69", EXPRESSION, FORMAT_REJECTED),
    (r"\boxed{69 \text{ (or 70)}}", "69", {}, FORMAT_REJECTED),
    # MATH-500 answers with text stay paid
    (r"\boxed{\frac{270}{7}\text{ degrees}}", r"\frac{270}7\text{ degrees}", {}, CORRECT),
    (r"\boxed{864 \text{ square inches}}", r"864 \mbox{ inches}^2", {}, CORRECT),
    (r"\boxed{5.4 \text{ cents}}", r"5.4 \text{ cents}", {}, CORRECT),
    (r"\boxed{\text{(C)}}", r"\text{(C)}", {}, CORRECT),
    (r"\boxed{\text{Evelyn}}", r"\text{Evelyn}", {}, CORRECT),
    (r"\boxed{18.90}", r"\$18.90", {}, CORRECT),
    (r"\boxed{1000}", r"1,\!000", {}, CORRECT),
    (r"\boxed{10}", r"10\%", {}, CORRECT),
]


@pytest.mark.parametrize("response, gold, kwargs, expected", GOLDEN)
def test_judge_golden(response, gold, kwargs, expected):
    assert judge(response, gold, AnswerSpec(**kwargs)) == expected


@pytest.mark.parametrize("response", [r"\boxed{not 0}", r"\boxed{0 is wrong}", r"\boxed{less than 0}",
                                      r"\boxed{0 or 1}", r"\boxed{maybe 0}", r"\boxed{\text{not } 0}"])
def test_words_times_a_zero_gold_are_not_paid_under_expression(response):
    """math-verify reads bare words as variables (`not 0` = n*o*t*0 = 0): hedge words are refused as such."""
    assert judge(response, "0", AnswerSpec(answer_format="expression")) == FORMAT_REJECTED


@pytest.mark.parametrize("response, gold", [(r"\boxed{2ab}", "2ab"), (r"\boxed{\sin x}", r"\sin x"),
                                            (r"\boxed{x \in [-2,7]}", "[-2,7]"), (r"\boxed{0}", "0")])
def test_products_of_variables_and_commands_are_not_hedge_words(response, gold):
    assert judge(response, gold, AnswerSpec(answer_format="expression")) == CORRECT


def test_golden_table_is_large_enough():
    assert len(GOLDEN) >= 40


@pytest.mark.parametrize(
    "gold, expected",
    [("69", "number"), ("-2.5", "number"), (r"\frac{3}{4}", "number"), (r"\frac{\pi}{2}", "expression"),
     ("2x", "expression"), ("5 apples", "expression"), ("(1,2]", "expression")],
)
def test_auto_format_is_number_only_for_bare_literals(gold, expected):
    assert resolve_answer_format("auto", gold) == expected


def test_unknown_names_list_the_known_ones():
    with pytest.raises(ValueError, match="answer_line"):
        judge(r"\boxed{1}", "1", AnswerSpec(answer_pattern="xml"))
    with pytest.raises(ValueError, match="last_number"):
        judge(r"\boxed{1}", "1", AnswerSpec(fallback="first_number"))
    with pytest.raises(ValueError, match="expression"):
        judge(r"\boxed{1}", "1", AnswerSpec(answer_format="numeric"))


def test_response_must_be_text():
    with pytest.raises(TypeError, match="response must be a str"):
        judge(None, "1", AnswerSpec())


@pytest.mark.parametrize(
    "response, pattern, require_number, expected",
    [(r"\boxed{69}", "boxed", False, 1.0), ("69", "boxed", False, 0.0), (r"\boxed{}", "boxed", False, 0.0),
     (r"\boxed{15+54}", "boxed", False, 1.0), (r"\boxed{15+54}", "boxed", True, 0.0),
     (r"\boxed{5 cm}", "boxed", True, 1.0), (r"\boxed{not 5}", "boxed", True, 0.0),
     ("Answer: 42", "answer_line", True, 1.0), (r"\boxed{42}", "answer_line", False, 0.0),
     (r"<think>\boxed{42}</think>", "boxed", False, 0.0),
     (r"<think>\boxed{41}</think>\boxed{42}", "boxed", False, 1.0)],
)
def test_format_reward(response, pattern, require_number, expected):
    assert format_reward(response, pattern, require_number=require_number) == expected

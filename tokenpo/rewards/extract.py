"""Find a response's final answer where the prompt asks for it, with an optional fallback.

Only the response is read, only after its last reasoning block (<think>...</think>), and only the
asked-for spot (the last \\boxed{}, or DAPO's `Answer:` line): scoring the whole completion pays answers
that restate the question, and scoring the reasoning pays answers the response then takes back.
"""

import re

from tokenpo.registry import Registry
from tokenpo.rewards.latex import BOX_OPEN_RE, group_end
from tokenpo.rewards.numbers import NUMBER_RE, normalize_math_text

# DAPO-Math-17k asks for a last line "Answer: $Answer"; DAPO's own grader takes the last such match.
_ANSWER_LINE_RE = re.compile(r"answer\s*:([^\n]+)", re.IGNORECASE)
# A `$` not escaped as `\$`; `$$` counts as one delimiter.
_DOLLAR_RE = re.compile(r"(?<!\\)\$\$?")


def after_reasoning(text: str, reasoning_tag: str | None) -> str | None:
    """The part of `text` after its last `</reasoning_tag>`; None while a reasoning block is still open.

    The closing tag alone counts, since chat templates may open the block in the prompt. `None` as the tag
    reads the whole text.
    """
    if reasoning_tag is None:
        return text
    closing = f"</{reasoning_tag}>"
    answer_part = text[text.rfind(closing) + len(closing):] if closing in text else text
    return None if f"<{reasoning_tag}>" in answer_part else answer_part


def last_boxed(text: str) -> str | None:
    """Whole content of the last outermost \\boxed{...} (or \\fbox{...}); None if none, or if its braces never close.

    Outermost, so a box inside a box (`\\boxed{70 \\text{ or } \\boxed{69}}`) is part of the answer, not the answer.
    """
    content, pos = None, 0
    while (opening := BOX_OPEN_RE.search(text, pos)) is not None:
        end = group_end(text, opening.end())
        if end is None:
            return None
        content, pos = text[opening.end(): end], end + 1
    return content


def answer_line(text: str) -> str | None:
    """What follows the last `Answer:` (DAPO format), markdown bold stripped."""
    found = None
    for found in _ANSWER_LINE_RE.finditer(text):
        pass
    return None if found is None else found.group(1).strip(" \t*")


def last_number(text: str) -> str | None:
    """The last numeric literal in `text` ("so the result is 69." -> "69"); None if there is none."""
    found = None
    for found in NUMBER_RE.finditer(normalize_math_text(text)):
        pass
    # `%` starts a LaTeX comment, so give math-verify the escaped form; the number parser reads both
    return None if found is None else found.group(0).replace("%", "\\%")


def last_dollar(text: str) -> str | None:
    """Content of the last closed `$...$` (or `$$...$$`) math span."""
    parts = _DOLLAR_RE.split(text)
    closed_spans = parts[1: 2 * ((len(parts) - 1) // 2): 2]
    return closed_spans[-1] if closed_spans else None


def no_fallback(text: str) -> None:
    """Fallback `none`: a response without the asked-for answer form has no answer."""
    return None


ANSWER_PATTERNS = Registry("answer_pattern", {"boxed": last_boxed, "answer_line": answer_line})
# How an extracted answer is compared with the gold (tokenpo.rewards.judging.judge); here beside the extraction
# choices so a config validates without math-verify
ANSWER_FORMATS = ("auto", "number", "expression")
FALLBACKS = Registry("fallback", {"none": no_fallback, "last_number": last_number, "last_dollar": last_dollar})


def extract_answer(
    response: str, answer_pattern: str = "boxed", fallback: str = "none", reasoning_tag: str | None = "think"
) -> str | None:
    """The final answer of `response` after its reasoning: from `answer_pattern`, else from `fallback`; None if
    neither finds one or the reasoning never closes."""
    find_asked_for = ANSWER_PATTERNS.get(answer_pattern)
    find_fallback = FALLBACKS.get(fallback)
    response = after_reasoning(response, reasoning_tag)
    if response is None:
        return None
    answer = find_asked_for(response)
    if not answer or not answer.strip():
        answer = find_fallback(response)
    return answer.strip() if answer and answer.strip() else None

"""Find a response's final answer where the prompt asks for it, with an optional fallback.

Only the response is read, and only the asked-for spot (the last \\boxed{}, or DAPO's `Answer:` line):
scoring the whole completion pays answers that restate the question.
"""

import re
from typing import Callable

from tokenpo.rewards.numbers import NUMBER_RE, normalize_math_text

_BOX_OPEN_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")
# DAPO-Math-17k asks for a last line "Answer: $Answer"; DAPO's own grader takes the last such match.
_ANSWER_LINE_RE = re.compile(r"answer\s*:([^\n]+)", re.IGNORECASE)
# A `$` not escaped as `\$`; `$$` counts as one delimiter.
_DOLLAR_RE = re.compile(r"(?<!\\)\$\$?")


def last_boxed(text: str) -> str | None:
    """Content of the last \\boxed{...} (or \\fbox{...}); None if there is none or its braces never close."""
    opening = None
    for opening in _BOX_OPEN_RE.finditer(text):
        pass
    if opening is None:
        return None
    depth, i = 1, opening.end()
    while i < len(text):
        char = text[i]
        if char == "\\":  # \{ and \} are set braces, not grouping
            i += 2
            continue
        depth += {"{": 1, "}": -1}.get(char, 0)
        if depth == 0:
            return text[opening.end(): i]
        i += 1
    return None


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


ANSWER_PATTERNS: dict[str, Callable[[str], str | None]] = {"boxed": last_boxed, "answer_line": answer_line}
FALLBACKS: dict[str, Callable[[str], str | None]] = {
    "none": no_fallback,
    "last_number": last_number,
    "last_dollar": last_dollar,
}


def _lookup(registry: dict, kind: str, name: str) -> Callable[[str], str | None]:
    if name not in registry:
        raise ValueError(f"unknown {kind} {name!r}; known: {', '.join(registry)}")
    return registry[name]


def extract_answer(response: str, answer_pattern: str = "boxed", fallback: str = "none") -> str | None:
    """The final answer of `response`: from `answer_pattern`, else from `fallback`; None if neither finds one."""
    find_asked_for = _lookup(ANSWER_PATTERNS, "answer_pattern", answer_pattern)
    find_fallback = _lookup(FALLBACKS, "fallback", fallback)
    answer = find_asked_for(response)
    if not answer or not answer.strip():
        answer = find_fallback(response)
    return answer.strip() if answer and answer.strip() else None

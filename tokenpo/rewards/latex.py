"""LaTeX structure in answers: brace groups and the commands that box an answer."""

import re

# \boxed{ and \fbox{ both box an answer
BOX_OPEN_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")


def group_end(text: str, start: int) -> int | None:
    """Index of the `}` closing the group whose `{` is just before `start`; None if it never closes."""
    depth, i = 1, start
    while i < len(text):
        char = text[i]
        if char == "\\":  # \{ and \} are set braces, not grouping
            i += 2
            continue
        depth += {"{": 1, "}": -1}.get(char, 0)
        if depth == 0:
            return i
        i += 1
    return None

"""Words in answers: the unit words an answer may carry, and prose that makes it more than one answer.

A strict grader pays `5 cm` but not `not 69`, `69 is wrong` or `69 \\text{ (or 70)}`: words beside an
answer's math are allowed only when they name its unit. Symbols ($, %, °, \\circ) are dropped earlier,
by tokenpo.rewards.numbers.normalize_math_text.
"""

import re

from tokenpo.rewards.latex import group_end

# Lower-case; singular and plural spelled out so the list says exactly what is accepted.
UNIT_WORDS = frozenset(
    """
    dollar dollars cent cents euro euros usd percent degree degrees
    mm cm m km in inch inches ft foot feet yd yard yards mile miles meter meters metre metres
    centimeter centimeters kilometer kilometers square sq cubic unit units
    g kg mg gram grams kilogram kilograms lb lbs pound pounds oz ounce ounces ton tons
    ml l liter liters litre litres gallon gallons cup cups
    s sec second seconds min minute minutes h hr hrs hour hours day days week weeks month months year years
    mph per
    """.split()
)
_WORD_RE = re.compile(r"[^\W\d_]+")
# what may separate unit words (km/h, sq. ft) or end the answer (5 cm.)
_UNIT_SEPARATORS = " \t\n.,/€£"
# Text-mode commands hold prose; math-mode ones (\mathrm, \mathbf) hold symbols and are math-verify's to read.
_PROSE_OPEN_RE = re.compile(r"\\(?:text|textbf|textit|textrm|textnormal|mbox)\s*\{")


def only_units(text: str) -> bool:
    """True if `text` is nothing but unit words (UNIT_WORDS) and spaces, `.`, `,`, `/` or a currency sign."""
    words = _WORD_RE.findall(text)
    return all(word.lower() in UNIT_WORDS for word in words) and not _WORD_RE.sub("", text).strip(_UNIT_SEPARATORS)


# English words that make an answer a statement about answers (`not 0`, `0 is wrong`, `less than 0`, `0 or 1`).
# Bare in math mode, math-verify reads a word as a product of variables, and `not 0` = n*o*t*0 equals a gold 0;
# in text mode they are prose. Function words only: a letter run that is a product of variables (`2ab`) stays.
HEDGE_WORDS = frozenset(
    """
    not isn is are was or and nor but than less more fewer greater smaller larger bigger
    wrong incorrect maybe perhaps probably possibly approximately roughly about around nearly almost
    either neither except unless guess
    """.split()
)
# a letter run not preceded by a backslash or another letter: `\\text`, `\\frac` are commands, not words
_BARE_WORD_RE = re.compile(r"(?<![\\a-zA-Z])[a-zA-Z]+")


def _prose_beside_math(answer: str) -> list[str] | None:
    """The text-mode prose blocks of an answer that also has math outside them; None for a word answer.

    `5.4 \\text{ cents}` -> [" cents"]; `\\text{(C)}` -> None (a word answer, compared as text). An
    unclosed block runs to the end.
    """
    math, prose, pos = [], [], 0
    while (opening := _PROSE_OPEN_RE.search(answer, pos)) is not None:
        end = group_end(answer, opening.end())
        end = len(answer) if end is None else end
        math.append(answer[pos: opening.start()])
        prose.append(answer[opening.end(): end])
        pos = end + 1
    math.append(answer[pos:])
    return prose if any(char.isalnum() for part in math for char in part) else None


def hedged(answer: str) -> bool:
    """True if prose beside the answer's math says more than its unit: `69 \\text{ (or 70)}`, `69 \\text{ is wrong}`.

    math-verify drops such trailing text and pays the 69; a strict grader reads a hedge, not an answer.
    """
    if any(word.lower() in HEDGE_WORDS for word in _BARE_WORD_RE.findall(answer)):
        return True
    prose = _prose_beside_math(answer)
    return prose is not None and not all(only_units(block) for block in prose)

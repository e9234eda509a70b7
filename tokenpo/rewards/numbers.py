"""Numeric literals in answers: find them in text and read their exact value.

The `number` answer format accepts one literal (69, -3, 1,000, 2.5, 3/4, \\frac{3}{4}, 50%) and never an
expression: SmolLM2-135M trained with a whole-completion math-verify reward learned to answer
"What is 15 + 54?" with `15 + 54`, which math-verify evaluates to 69 and pays. For the same reason a
fraction only counts in lowest terms (3/4, not 84/7, which would pay an echoed "What is 84 / 7?").

Words around the literal may only name its unit (`5 cm`, `\\$5`, `x = 5`), so `not 69`, `69 is wrong` and
`less than 69` are not answers.
"""

import re
from fractions import Fraction
from math import gcd

from tokenpo.rewards.prose import only_units

# An integer with thousands separators (1,000) or plain digits; `(?!\d)` keeps 1,0000 from reading as 1,000.
# Any digits may lead the separators so that a wrong grouping (0,069) is one literal, refused by _digits.
_INT = r"(?:\d+(?:,\d{3})+(?!\d)|\d+)"
# A correct grouping: 1 to 3 leading digits, not starting with 0 (0,069 is not 69; 1,069 is 1069).
_GROUPED_INT_RE = re.compile(r"[1-9]\d{0,2}(?:,\d{3})+")

# A sign counts only where it cannot be a binary minus: `10-3` holds the literals 10 and 3, `x = -3` holds -3.
NUMBER_RE = re.compile(
    r"(?:(?<![\w)\]}])(?P<sign>[-+]))?"
    r"(?:\\[dt]?frac\s*(?:\{\s*(?P<tex_num>-?\d+)\s*\}|(?P<tex_num_digit>\d))"
    r"\s*(?:\{\s*(?P<tex_den>\d+)\s*\}|(?P<tex_den_digit>\d))"
    rf"|(?P<num>{_INT})\s*/\s*(?P<den>{_INT})"
    rf"|(?P<dec>{_INT}?\.\d+|{_INT}))"
    r"(?P<percent>\s*%)?"
)

# Markup that wraps or decorates a number without changing it: \text{5 apples}, \$5, 1\,000, 90^\circ.
_WRAPPER_RE = re.compile(r"\\(?:text|textbf|textrm|mathrm|mathbf|mbox|boxed|fbox)\s*\{([^{}]*)\}")
_DECORATION_RE = re.compile(r"\\[,;:! ]|\\(?:left|right|displaystyle)\b|\\\$|\$|~|\^\s*\{?\s*\\circ\s*\}?|°")
# A unit's exponent (cm^2, m^{3}) would otherwise read as a second literal.
_UNIT_EXPONENT_RE = re.compile(r"(?<=[^\W\d_])\s*\^\s*(?:\{\s*\d+\s*\}|\d)")
# A one-letter variable naming the answer: "x = 5".
_VARIABLE_RE = re.compile(r"^\s*[^\W\d_]\s*=")


def normalize_math_text(text: str) -> str:
    """`text` with unicode minus, LaTeX spacing, currency/percent escapes and text wrappers made plain."""
    text = text.replace("\u2212", "-").replace("{,}", ",").replace("\\%", "%")
    # two passes unwrap \text{\textbf{5}}; a fixed count keeps a pathologically nested input linear
    for _ in range(2):
        text = _WRAPPER_RE.sub(r" \1 ", text)
    text = _DECORATION_RE.sub("", text)
    return _UNIT_EXPONENT_RE.sub("", text)


def _digits(integer: str) -> str:
    """`integer` without its thousands separators; ValueError where they group wrongly (0,069, 1234,567)."""
    if "," in integer and not _GROUPED_INT_RE.fullmatch(integer):
        raise ValueError(f"badly grouped thousands: {integer}")
    return integer.replace(",", "")


def _literal_value(match: re.Match) -> tuple[Fraction, bool] | None:
    """(value, written in lowest terms) of a NUMBER_RE match; None for a zero denominator, a badly grouped
    or a huge literal."""
    try:
        if match["dec"] is not None:
            whole, point, fraction = match["dec"].partition(".")
            value, lowest_terms = Fraction(_digits(whole) + point + fraction), True
        else:
            if match["num"] is not None:
                num, den = int(_digits(match["num"])), int(_digits(match["den"]))
            else:
                num = int(match["tex_num"] or match["tex_num_digit"])
                den = int(match["tex_den"] or match["tex_den_digit"])
            if den == 0:
                return None
            value, lowest_terms = Fraction(num, den), den > 1 and gcd(num, den) == 1
    except ValueError:  # bad grouping, or Python refusing to read integers of over 4300 digits (no answer is)
        return None
    return (-value if match["sign"] == "-" else value), lowest_terms


def _single_literal(text: str) -> tuple[re.Match, str] | None:
    """The only numeric literal in `text` (normalized) and the text around it; None unless exactly one."""
    text = normalize_math_text(text)
    matches = list(NUMBER_RE.finditer(text))
    if len(matches) != 1:
        return None
    found = matches[0]
    return found, text[: found.start()] + " " + text[found.end():]


def parse_answer_number(answer: str) -> Fraction | None:
    """Value of an answer that is one numeric literal with at most its unit around it ("5 cm", "x = 5").

    None for expressions (`15 + 54`), several numbers, a fraction not in lowest terms, or other words
    around the literal (`not 69`, `5 apples`). A percent sign is dropped (50% reads as 50), so a gold "50"
    accepts "50%".
    """
    found = _single_literal(answer)
    if found is None or not only_units(_VARIABLE_RE.sub("", found[1], count=1)):
        return None
    value = _literal_value(found[0])
    return value[0] if value is not None and value[1] else None


def parse_gold_number(gold: str) -> Fraction | None:
    """Value of a gold answer that is a bare numeric literal ("27.0", "1,000", "\\frac{1}{2}"); else None."""
    found = _single_literal(gold)
    if found is None or found[1].strip():
        return None
    value = _literal_value(found[0])
    return None if value is None else value[0]

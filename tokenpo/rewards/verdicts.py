"""What scoring one response can conclude, and the per-step metrics over a batch of conclusions."""

from collections import Counter
from typing import Sequence

CORRECT = "correct"
WRONG = "wrong"
# nothing extractable in the asked-for form (nor by the fallback), including an empty response
NO_ANSWER = "no_answer"
# an answer was found but is not one answer: not a numeric literal (with at most its unit) under the `number`
# format (`15 + 54`, `not 69`), or hedged by prose beside its math under `expression` (`69 \text{ (or 70)}`)
FORMAT_REJECTED = "format_rejected"
# the gold answer itself cannot be parsed: a data problem, not the model's
GOLD_INVALID = "gold_invalid"
# scoring ran past reward.timeout_s (pathological response); counted as wrong
TIMEOUT = "timeout"
# a user reward function raised or returned a non-bool, or a worker died; counted as wrong
ERROR = "error"

VERDICTS = (CORRECT, WRONG, NO_ANSWER, FORMAT_REJECTED, GOLD_INVALID, TIMEOUT, ERROR)


def count_verdicts(verdicts: Sequence[str]) -> dict[str, float]:
    """Per-step reward metrics: fractions of the batch per verdict, and the count of invalid golds."""
    counts = Counter(verdicts)
    unknown = set(counts) - set(VERDICTS)
    if unknown:
        raise ValueError(f"unknown verdicts {sorted(unknown)}; known: {', '.join(VERDICTS)}")
    total = len(verdicts)

    def fraction(*names: str) -> float:
        return sum(counts[name] for name in names) / total if total else 0.0

    return {
        "reward/correct_frac": fraction(CORRECT),
        "reward/wrong_frac": fraction(WRONG),
        "reward/no_answer_frac": fraction(NO_ANSWER),
        "reward/format_rejected_frac": fraction(FORMAT_REJECTED),
        "reward/timeout_frac": fraction(TIMEOUT),
        "reward/error_frac": fraction(ERROR),
        # an answer found (asked-for form or fallback) that passed the format check and was compared
        "reward/answer_extracted_frac": fraction(CORRECT, WRONG),
        "reward/gold_invalid": counts[GOLD_INVALID],
    }


def correct_counts(verdicts: Sequence[str]) -> tuple[int, int]:
    """(responses judged correct, responses judged at all: those whose gold answer parses)."""
    return sum(v == CORRECT for v in verdicts), sum(v != GOLD_INVALID for v in verdicts)

"""Gold-answer and problem-text parsers for the hub layouts (GSM8K `####`, DAPO's instruction wrapper).

MATH's `\\boxed{}` answers are read with the reward's own `last_boxed`, so gold and responses parse alike.
"""

from __future__ import annotations

# DAPO-Math-17k wraps every problem in this instruction (user message of its `prompt` column).
DAPO_PREFIX = (
    "Solve the following math problem step by step. The last line of your response should be of the form "
    "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n"
)
DAPO_SUFFIX = '\n\nRemember to put your answer on its own line after "Answer:".'


def gsm8k_final_answer(solution: str) -> str | None:
    """The number after GSM8K's `####` marker with thousands separators removed ("1,234" -> "1234"); None if absent."""
    if "####" not in solution:
        return None
    return solution.rsplit("####", 1)[1].strip().replace(",", "")


def strip_dapo_wrapper(text: str) -> str:
    """The bare problem inside DAPO's instruction wrapper; text without the wrapper comes back stripped only."""
    text = text.strip()
    if text.startswith(DAPO_PREFIX.strip()):
        text = text[len(DAPO_PREFIX.strip()) :]
    if text.endswith(DAPO_SUFFIX.strip()):
        text = text[: -len(DAPO_SUFFIX.strip())]
    return text.strip()

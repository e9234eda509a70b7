"""Rewards for math answers: find the final answer, check it against the gold, score batches off the loop.

Light on purpose (no torch): the scoring worker processes import only this package.
"""

from tokenpo.rewards.config import RewardConfig, resolve, reward_config_from_dict
from tokenpo.rewards.extract import extract_answer
from tokenpo.rewards.numbers import parse_answer_number, parse_gold_number
from tokenpo.rewards.pool import RewardScorer
from tokenpo.rewards.user_fn import load_reward_fn
from tokenpo.rewards.verdicts import (
    CORRECT,
    ERROR,
    FORMAT_REJECTED,
    GOLD_INVALID,
    NO_ANSWER,
    TIMEOUT,
    VERDICTS,
    WRONG,
    count_verdicts,
)
from tokenpo.rewards.verify import format_reward, judge, resolve_answer_format, verify

__all__ = [
    "CORRECT",
    "ERROR",
    "FORMAT_REJECTED",
    "GOLD_INVALID",
    "NO_ANSWER",
    "TIMEOUT",
    "VERDICTS",
    "WRONG",
    "RewardConfig",
    "RewardScorer",
    "count_verdicts",
    "extract_answer",
    "format_reward",
    "judge",
    "load_reward_fn",
    "parse_answer_number",
    "parse_gold_number",
    "resolve",
    "resolve_answer_format",
    "reward_config_from_dict",
    "verify",
]

"""Rewards for math answers: find the final answer, check it against the gold, score batches in worker processes.

Light on purpose (no torch): the scoring worker processes import only this package.
"""

from tokenpo.rewards.config import RewardConfig, resolve, reward_config_from_dict
from tokenpo.rewards.extract import extract_answer
from tokenpo.rewards.judging import format_reward, judge, resolve_answer_format
from tokenpo.rewards.numbers import parse_answer_number, parse_gold_number
from tokenpo.rewards.pool import Judged, Question, RewardScorer, Scorer, question
from tokenpo.rewards.spec import AnswerSpec, answer_spec
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
    correct_counts,
    count_verdicts,
)

__all__ = [
    "CORRECT",
    "ERROR",
    "FORMAT_REJECTED",
    "GOLD_INVALID",
    "NO_ANSWER",
    "TIMEOUT",
    "VERDICTS",
    "WRONG",
    "AnswerSpec",
    "Judged",
    "Question",
    "RewardConfig",
    "RewardScorer",
    "Scorer",
    "answer_spec",
    "correct_counts",
    "count_verdicts",
    "extract_answer",
    "format_reward",
    "judge",
    "load_reward_fn",
    "parse_answer_number",
    "parse_gold_number",
    "question",
    "resolve",
    "resolve_answer_format",
    "reward_config_from_dict",
]

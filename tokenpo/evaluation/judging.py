"""How answers are read: the dataset's answer format as the reward's defaults, and how a benchmark's answers are
judged (the same in training-time evaluation and `tokenpo.evaluate`)."""

from __future__ import annotations

from dataclasses import replace

from tokenpo.data.config import DataConfig
from tokenpo.rewards.config import RewardConfig
from tokenpo.rewards.weighted import DEFAULT_FUNCTIONS


def data_reward_defaults(data: DataConfig) -> dict:
    """How the dataset asks for its answer; the reward config's nulls take these values."""
    return {"answer_format": data.answer_format, "answer_pattern": data.answer_pattern, "fallback": data.fallback}


def benchmark_reward(reward: RewardConfig, benchmark: DataConfig) -> RewardConfig:
    """How a benchmark's answers are judged; training-time eval and `tokenpo.evaluate` both call this.

    The answer format, pattern and fallback are always the benchmark's data config's (eval.data, or data when
    eval.data is null): explicit reward.* values of them shape the training reward only, so a checkpoint gets one
    accuracy whatever data it was trained on. reward.fn (the user's verifier), timeout_s and num_workers apply;
    reward.functions (the training reward) do not: a benchmark scores the verdict.
    """
    return replace(reward, **data_reward_defaults(benchmark),
                   functions=[dict(entry) for entry in DEFAULT_FUNCTIONS]).validate()

"""How a response's final answer is read and checked: the settings `judge` reads, as one typed value."""

from dataclasses import dataclass

from tokenpo.errors import ConfigError
from tokenpo.rewards.config import DATASET_FIELDS, RewardConfig
from tokenpo.rewards.extract import extract_answer


@dataclass(frozen=True)
class AnswerSpec:
    """Where the final answer is (answer_pattern, else fallback, after the last </reasoning_tag>) and how it is
    compared with the gold (answer_format, decimal_tolerance, within timeout_s seconds).

    The defaults are the built-in reading, `answer_spec(resolve(RewardConfig(), {}))`; conf/reward/default.yaml
    documents each field.
    """

    answer_format: str = "auto"
    answer_pattern: str = "boxed"
    fallback: str = "none"
    reasoning_tag: str | None = "think"
    timeout_s: float = 5.0
    decimal_tolerance: float | None = None

    def answer(self, response: str) -> str | None:
        """The final answer of `response`, found by the pattern or else the fallback."""
        return extract_answer(response, self.answer_pattern, self.fallback, self.reasoning_tag)

    def in_asked_form(self, response: str) -> bool:
        """Whether `response` gives its answer in the asked-for form (e.g. \\boxed{}), not only by the fallback."""
        return extract_answer(response, self.answer_pattern, "none", self.reasoning_tag) is not None


def answer_spec(reward: RewardConfig) -> AnswerSpec:
    """The answer reading of a resolved `reward` section (tokenpo.rewards.config.resolve fills the dataset's)."""
    for name in DATASET_FIELDS:
        if getattr(reward, name) is None:
            raise ConfigError(f"reward.{name} is null: pass the config through resolve() with the dataset's defaults")
    return AnswerSpec(answer_format=reward.answer_format, answer_pattern=reward.answer_pattern,
                      fallback=reward.fallback, reasoning_tag=reward.reasoning_tag, timeout_s=reward.timeout_s,
                      decimal_tolerance=reward.decimal_tolerance)

"""The unit every loader returns, and the per-split account of what loading dropped."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Example:
    """One math problem: `problem` is the bare question (no instructions), `answer` the gold answer as text."""

    uid: str
    problem: str
    answer: str
    meta: dict = field(default_factory=dict, compare=False)


@dataclass
class LoadReport:
    """Counts for one loaded split, so dropped rows are reported instead of crashing or vanishing silently."""

    source: str
    split: str
    rows_read: int = 0
    kept: int = 0
    empty_problem: int = 0
    empty_answer: int = 0
    duplicate_problem: int = 0
    missing_field: int = 0
    # data.max_prompt_tokens (0: no cap), how many prompts are longer, and what became of them (data.overlong_prompt)
    max_prompt_tokens: int = 0
    overlong_prompt: int = 0
    overlong_action: str = "drop"

    @property
    def dropped(self) -> int:
        overlong_dropped = self.overlong_prompt if self.overlong_action == "drop" else 0
        return self.empty_problem + self.empty_answer + self.duplicate_problem + self.missing_field + overlong_dropped

    def summary(self) -> str:
        text = (
            f"{self.source} [{self.split}]: kept {self.kept} of {self.rows_read} rows; dropped "
            f"{self.empty_problem} empty problem, {self.empty_answer} empty answer, "
            f"{self.duplicate_problem} duplicate problem, {self.missing_field} missing field"
        )
        if not self.max_prompt_tokens:
            return text
        fate = "dropped" if self.overlong_action == "drop" else f"kept, {self.overlong_action} when encoded"
        return f"{text}; {self.overlong_prompt} prompts over {self.max_prompt_tokens} tokens ({fate})"

"""Prompt templates: how a bare problem becomes the text the policy sees (chat template or plain text)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from tokenpo.errors import ConfigError
from tokenpo.schema import setting

if TYPE_CHECKING:
    from tokenpo.data.config import DataConfig

MODES = ("chat", "raw")
PROBLEM_SLOT = "{problem}"
# What a prompt over data.max_prompt_tokens becomes (verl's filter_overlong_prompts and truncation left/middle/error):
# drop it at load time, keep its last tokens, keep both ends, or stop at start-up. verl's `right` is left out: it
# cuts the instruction and the chat template's generation prompt, so the policy would continue the question.
OVERLONG_PROMPT = ("drop", "truncate_left", "truncate_middle", "error")


@dataclass
class PromptTemplate:
    """`chat`: the tokenizer's chat template (generation prompt added); `raw`: plain text for base models.

    The user text is `problem + instruction` in both modes; raw mode puts it into `raw_format` at `{problem}`
    (plain substitution, so LaTeX braces in problems and formats need no escaping).
    """

    mode: str = setting("chat",
        "chat = the tokenizer's chat template with the generation prompt; raw = plain text for base models.")
    system_prompt: str | None = setting(None, "System message (null = the chat template's default).")
    instruction: str = setting("",
        "Text appended after the problem; asks for a boxed number so the reward can find it.",
        shipped="each dataset asks for its answer in its own words; a template built in code asks nothing")
    raw_format: str = setting("Question: {problem}\nAnswer:",
        "Raw-mode text around the problem ({problem} = problem + instruction); unused in chat mode.")

    def validate(self, prefix: str = "data.template") -> None:
        if self.mode not in MODES:
            raise ConfigError(f"{prefix}.mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if self.system_prompt is not None and not isinstance(self.system_prompt, str):
            raise ConfigError(f"{prefix}.system_prompt must be a string or null, got {self.system_prompt!r}")
        if not isinstance(self.instruction, str):
            raise ConfigError(f"{prefix}.instruction must be a string, got {self.instruction!r}")
        if not isinstance(self.raw_format, str) or PROBLEM_SLOT not in self.raw_format:
            raise ConfigError(f"{prefix}.raw_format must contain {PROBLEM_SLOT}, got {self.raw_format!r}")


def build_prompt(problem: str, tokenizer, template: PromptTemplate) -> str:
    """The full prompt text for one problem; `tokenizer` is only used in chat mode."""
    user_text = problem + template.instruction
    if template.mode == "raw":
        text = template.raw_format.replace(PROBLEM_SLOT, user_text)
        # Base models have no system role: the system prompt, if any, leads the text.
        return text if template.system_prompt is None else f"{template.system_prompt}\n\n{text}"
    if getattr(tokenizer, "chat_template", None) is None:
        raise ConfigError(
            f"data.template.mode is 'chat' but tokenizer {getattr(tokenizer, 'name_or_path', '')!r} has no chat "
            "template; use data.template.mode: raw with a raw_format"
        )
    messages = [{"role": "user", "content": user_text}]
    if template.system_prompt is not None:
        messages.insert(0, {"role": "system", "content": template.system_prompt})
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def prompt_token_ids(problem: str, tokenizer, template: PromptTemplate) -> list[int]:
    # the rendered prompt already holds the template's special tokens; the tokenizer must not add a second BOS
    return tokenizer(build_prompt(problem, tokenizer, template), add_special_tokens=False)["input_ids"]


def truncate_prompt(ids: list[int], max_tokens: int, overlong: str) -> list[int]:
    """`ids` cut to `max_tokens`: truncate_left keeps the end (the question's end, the instruction and the
    generation prompt), truncate_middle keeps the first half and the last half (the template's head as well)."""
    if len(ids) <= max_tokens:
        return ids
    if overlong == "truncate_left":
        return ids[-max_tokens:]
    if overlong == "truncate_middle":
        head = max_tokens // 2
        return ids[:head] + ids[len(ids) - (max_tokens - head):]
    raise ValueError(f"a {len(ids)}-token prompt is over data.max_prompt_tokens={max_tokens} but data.overlong_prompt "
                     f"is {overlong!r}: such prompts must be removed when the data is loaded (load_splits)")


def capped_prompt_ids(problem: str, tokenizer, data: DataConfig) -> list[int]:
    """The prompt's token ids under data.template, within data.max_prompt_tokens (0 or null: no cap)."""
    ids = prompt_token_ids(problem, tokenizer, data.template)
    return truncate_prompt(ids, data.max_prompt_tokens, data.overlong_prompt) if data.max_prompt_tokens else ids


def describe_template(template: PromptTemplate, tokenizer=None) -> str:
    """A loggable account of the template; with a tokenizer, the exact rendering with `{problem}` as placeholder."""
    text = (
        f"mode={template.mode} system_prompt={template.system_prompt!r} instruction={template.instruction!r}"
        + (f" raw_format={template.raw_format!r}" if template.mode == "raw" else "")
    )
    if tokenizer is None and template.mode == "chat":
        return text
    return f"{text}\nrendered:\n{build_prompt(PROBLEM_SLOT, tokenizer, template)}"

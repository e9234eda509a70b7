"""Prompt templates rendered with the real SmolLM2 chat template, raw mode, and the no-template error."""

import types

import pytest

from tokenpo.data import PromptTemplate, build_prompt, describe_template
from tokenpo.errors import ConfigError

SMOL_DEFAULT_SYSTEM = (
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
)


def test_chat_mode_renders_the_tokenizer_template_with_generation_prompt(smollm2_tokenizer):
    template = PromptTemplate(mode="chat", instruction=" Give the final answer as a number in \\boxed{}.")
    assert build_prompt("What is 7 + 5?", smollm2_tokenizer, template) == (
        SMOL_DEFAULT_SYSTEM
        + "<|im_start|>user\nWhat is 7 + 5? Give the final answer as a number in \\boxed{}.<|im_end|>\n"
        + "<|im_start|>assistant\n"
    )


def test_chat_mode_system_prompt_replaces_the_default(smollm2_tokenizer):
    template = PromptTemplate(mode="chat", system_prompt="You are a calculator.")
    assert build_prompt("What is 2 × 3?", smollm2_tokenizer, template) == (
        "<|im_start|>system\nYou are a calculator.<|im_end|>\n<|im_start|>user\nWhat is 2 × 3?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_raw_mode_is_plain_substitution_latex_braces_untouched():
    template = PromptTemplate(mode="raw", instruction=" Answer in \\boxed{}.", raw_format="Q: {problem}\nA:")
    expected = "Q: Is $\\frac{1}{2} < 1$? Answer in \\boxed{}.\nA:"
    assert build_prompt("Is $\\frac{1}{2} < 1$?", None, template) == expected
    with_system = PromptTemplate(mode="raw", system_prompt="Be brief.", raw_format="{problem}")
    assert build_prompt("x", None, with_system) == "Be brief.\n\nx"


def test_chat_mode_without_chat_template_is_a_clear_error():
    base_tokenizer = types.SimpleNamespace(chat_template=None, name_or_path="some/base-model")
    with pytest.raises(ConfigError, match=r"tokenizer 'some/base-model' has no chat template; use "
                                          r"data.template.mode: raw"):
        build_prompt("What is 1 + 1?", base_tokenizer, PromptTemplate(mode="chat"))


def test_describe_template_shows_the_exact_rendering(smollm2_tokenizer):
    template = PromptTemplate(mode="chat", instruction=" Box it.")
    described = describe_template(template, smollm2_tokenizer)
    assert described == (
        "mode=chat system_prompt=None instruction=' Box it.'\nrendered:\n" + SMOL_DEFAULT_SYSTEM
        + "<|im_start|>user\n{problem} Box it.<|im_end|>\n<|im_start|>assistant\n"
    )
    assert describe_template(PromptTemplate(mode="raw", raw_format="Q: {problem}\nA:")) == (
        "mode=raw system_prompt=None instruction='' raw_format='Q: {problem}\\nA:'\nrendered:\nQ: {problem}\nA:"
    )


@pytest.mark.parametrize(
    "values, message",
    [
        ({"mode": "plain"}, r"data.template.mode must be one of chat, raw, got 'plain'"),
        ({"raw_format": "Q: {question}"}, r"data.template.raw_format must contain \{problem\}"),
        ({"instruction": None}, r"data.template.instruction must be a string"),
        ({"system_prompt": 3}, r"data.template.system_prompt must be a string or null"),
    ],
)
def test_bad_template_is_a_config_error(values, message):
    with pytest.raises(ConfigError, match=message):
        PromptTemplate(**values).validate()

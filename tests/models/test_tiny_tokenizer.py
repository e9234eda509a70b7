"""The tiny model's built-in byte tokenizer: self-contained, lossless, ChatML-templated, saved and reloaded."""

import subprocess
import sys

import pytest

from tokenpo.models.loading import load_model
from tokenpo.models.config import ModelConfig
from tokenpo.models.tiny_tokenizer import CHAT_END, PAD, TINY_VOCAB_SIZE, build_tiny_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny_tokenizer()


@pytest.mark.parametrize("text", ["What is 2 × 3?", "héllo  wörld\n\tend", r"\boxed{\frac{1}{2}}", "数学 🙂",
                                  ""])
def test_every_text_round_trips_one_token_per_byte(tokenizer, text):
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert ids == list(text.encode("utf-8"))
    assert tokenizer.decode(ids) == text


def test_chat_template_and_special_tokens(tokenizer):
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "2+2?"}], tokenize=False,
                                           add_generation_prompt=True)
    assert prompt == "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n"
    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    assert ids[0] == 257 and ids.count(258) == 1 and len(ids) == 3 + len("user\n2+2?\n") + len("assistant\n")
    assert (len(tokenizer), tokenizer.eos_token, tokenizer.pad_token) == (TINY_VOCAB_SIZE, CHAT_END, PAD)
    assert tokenizer.decode(ids, skip_special_tokens=True) == "user\n2+2?\nassistant\n"


def test_tiny_model_uses_it_and_it_survives_save_and_reload(tmp_path):
    from transformers import AutoTokenizer

    tokenizer, model = load_model(ModelConfig(name="tiny", source="tiny"), seed=0)
    assert model.config.vocab_size == TINY_VOCAB_SIZE and tokenizer.padding_side == "left"
    tokenizer.save_pretrained(tmp_path)
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    text = "<|im_start|>user\n7 × 8?<|im_end|>\n"
    assert reloaded(text)["input_ids"] == tokenizer(text)["input_ids"]
    assert reloaded.chat_template == tokenizer.chat_template and reloaded.eos_token_id == tokenizer.eos_token_id


def test_vocab_size_is_known_without_transformers():
    code = "import sys, tokenpo.models.tiny_tokenizer as t; print(t.TINY_VOCAB_SIZE, 'transformers' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.split() == [
        str(TINY_VOCAB_SIZE), "False"]

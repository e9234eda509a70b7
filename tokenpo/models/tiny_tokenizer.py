"""The tiny model's own tokenizer, built in code: one token per UTF-8 byte and ChatML's special tokens.

It needs no download and no other package, so an installed tokenpo runs `model=tiny` anywhere (offline, from an
empty directory). Importing this module is light (no transformers): TINY_VOCAB_SIZE sizes the model without it.
"""

from __future__ import annotations

# token ids 0-255 are the bytes themselves; the special tokens follow
PAD, CHAT_START, CHAT_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = (PAD, CHAT_START, CHAT_END)
TINY_VOCAB_SIZE = 256 + len(SPECIAL_TOKENS)
# ChatML, as SmolLM2 and Qwen2.5 write it, without a default system message (the tiny model needs none)
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def byte_symbols() -> list[str]:
    """The printable character standing for each byte 0-255 in byte-level BPE (GPT-2's table): printable
    Latin-1 bytes stand for themselves, the others are shifted past 255."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    shifted = iter(range(256, 512))
    return [chr(byte) if byte in printable else chr(next(shifted)) for byte in range(256)]


def build_tiny_tokenizer():
    """A transformers fast tokenizer over bytes, its chat template ChatML; eos `<|im_end|>`, pad `<|endoftext|>`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {symbol: byte for byte, symbol in enumerate(byte_symbols())}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(list(SPECIAL_TOKENS))
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=CHAT_END, pad_token=PAD,
                                   chat_template=CHAT_TEMPLATE)

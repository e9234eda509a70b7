"""The policy's tokenizer, set up for generation. Torch-free at import: the start-up checks count prompt tokens with
it before any model code loads (transformers' tokenizer classes, and for hub models torch, come in on first use)."""

from __future__ import annotations

from tokenpo.models.config import ModelConfig
from tokenpo.models.locate import tokenizer_model_config
from tokenpo.models.tiny_tokenizer import build_tiny_tokenizer


def load_tokenizer(cfg: ModelConfig, tokenizer_source: str):
    from transformers import AutoTokenizer

    return for_generation(AutoTokenizer.from_pretrained(tokenizer_source, trust_remote_code=cfg.trust_remote_code))


def for_generation(tokenizer):
    """`tokenizer` padding prompts on the left, with a pad token."""
    # left padding: generation appends to the right end of every prompt
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def tiny_tokenizer(cfg: ModelConfig):
    """The tiny model's tokenizer: its built-in byte tokenizer, or the one of the model named by tokenizer_from."""
    source = tokenizer_model_config(cfg)
    if source is None:
        return for_generation(build_tiny_tokenizer())
    from tokenpo.models.loading import resolve_pretrained_dir  # imports torch: a folder may need GGUF conversion

    return load_tokenizer(source, resolve_pretrained_dir(source))

"""The folder a vLLM engine or server builds its model from: the model's config and the tokenizer, no weights (every
weight arrives through the engine's `load`)."""

from __future__ import annotations

import copy
import tempfile


def model_folder(config, architecture: str | None, tokenizer) -> tempfile.TemporaryDirectory:
    """A folder with the base model's Hugging Face `config` and `tokenizer` (no weights): what vLLM builds its model
    from (a LoRA policy publishes merged weights); `architecture`, the class vLLM builds where the config names none
    (a config made in memory)."""
    folder = tempfile.TemporaryDirectory(prefix="tokenpo-vllm-")
    config = copy.deepcopy(config)
    config.architectures = config.architectures or [architecture]
    if config.architectures == [None]:
        raise ValueError("the model's config names no architecture (its class) for vLLM to build")
    config.save_pretrained(folder.name)
    tokenizer.save_pretrained(folder.name)
    return folder

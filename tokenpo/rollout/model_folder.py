"""The folder a vLLM engine or server builds its model from: the published model's config and the tokenizer, no weights
(every weight arrives through the engine's `load`)."""

from __future__ import annotations

import copy
import tempfile

from tokenpo.models.published import Published


def model_folder(published: Published, tokenizer) -> tempfile.TemporaryDirectory:
    """A folder with the published model's config and tokenizer (no weights): what vLLM builds its model from (the
    base model's: a LoRA policy publishes merged weights)."""
    folder = tempfile.TemporaryDirectory(prefix="tokenpo-vllm-")
    config = copy.deepcopy(published.config)
    # the class vLLM builds: a config made in memory (the tiny model) names none
    config.architectures = config.architectures or [published.architecture]
    config.save_pretrained(folder.name)
    tokenizer.save_pretrained(folder.name)
    return folder

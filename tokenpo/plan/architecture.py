"""A model's architecture numbers, read from its `config.json` without loading any weight.

Where the file comes from (`find_config_json`): a local folder (model.source=local, or a hub id that is a folder),
the Hugging Face cache, or the copy shipped in conf/model/configs/<model.name>.json (public architecture numbers,
so a plan works offline). The tiny model has no file: its shape is model.tiny and its vocabulary the tokenizer's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from tokenpo import CONF_DIR
from tokenpo.errors import ConfigError
from tokenpo.models.config import ModelConfig
from tokenpo.models.tiny_tokenizer import TINY_VOCAB_SIZE

SHIPPED_CONFIGS = Path(CONF_DIR) / "model" / "configs"
# architectures whose attention projections q, k, v carry a bias without saying so in config.json
QKV_BIAS_MODEL_TYPES = ("qwen2",)


@dataclass(frozen=True)
class Architecture:
    """A decoder-only transformer with gated MLP (Llama, Qwen2, Mistral): what memory depends on."""

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    tie_word_embeddings: bool
    qkv_bias: bool
    max_position_embeddings: int
    # positions the model may run over: max_position_embeddings, or rope_scaling's factor x its original positions
    # where that is larger (Qwen2.5's YaRN entry keeps max_position_embeddings at the trained 32768)
    context_length: int

    @property
    def q_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim


def architecture_from_config(config: dict, where: str) -> Architecture:
    """The numbers of a Hugging Face `config.json` (one-line error naming the missing key)."""
    def get(key: str, default=None):
        if key in config:
            return config[key]
        if default is None:
            raise ConfigError(f"{where}: config.json has no {key!r} (tokenpo.plan knows decoder-only models with "
                              "hidden_size, num_hidden_layers, num_attention_heads, intermediate_size, vocab_size)")
        return default

    heads = get("num_attention_heads")
    hidden = get("hidden_size")
    return Architecture(
        vocab_size=get("vocab_size"),
        hidden_size=hidden,
        num_layers=get("num_hidden_layers"),
        num_heads=heads,
        num_kv_heads=get("num_key_value_heads", heads),
        head_dim=config.get("head_dim") or hidden // heads,
        intermediate_size=get("intermediate_size"),
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        qkv_bias=bool(config.get("attention_bias", config.get("model_type") in QKV_BIAS_MODEL_TYPES)),
        max_position_embeddings=get("max_position_embeddings", 2048),
        context_length=context_length(config),
    )


def context_length(config: dict) -> int:
    """Positions a config.json allows: max_position_embeddings, raised by a rope_scaling factor (yarn, linear,
    dynamic: factor x original_max_position_embeddings, as transformers' RoPE initialisation reads it)."""
    positions = config.get("max_position_embeddings", 2048)
    scaling = config.get("rope_scaling") or {}
    factor = scaling.get("factor")
    if not factor:
        return positions
    original = scaling.get("original_max_position_embeddings", positions)
    return max(positions, int(factor * original))


def num_parameters(arch: Architecture) -> int:
    """Parameters of the model: embeddings, per layer attention (q, k, v, o; q/k/v biases where the architecture
    has them) + gated MLP (gate, up, down) + two RMSNorms, the final norm, and an untied output layer."""
    h, i = arch.hidden_size, arch.intermediate_size
    attention = h * arch.q_dim + 2 * h * arch.kv_dim + arch.q_dim * h
    if arch.qkv_bias:
        attention += arch.q_dim + 2 * arch.kv_dim
    layer = attention + 3 * h * i + 2 * h
    embeddings = arch.vocab_size * h
    head = 0 if arch.tie_word_embeddings else arch.vocab_size * h
    return embeddings + arch.num_layers * layer + h + head


def find_config_json(cfg: ModelConfig) -> tuple[dict, str]:
    """(config.json's contents, where it was read) for a model config, without the network."""
    candidates = []
    if cfg.source == "local" and cfg.path:
        candidates.append(Path(cfg.path).expanduser() / "config.json")
    if cfg.hub_id:
        candidates.append(Path(cfg.hub_id).expanduser() / "config.json")
        cached = _hub_cache_config(cfg.hub_id)
        if cached is not None:
            candidates.append(cached)
    candidates.append(SHIPPED_CONFIGS / f"{cfg.name}.json")
    for path in candidates:
        if path.is_file():
            return json.loads(path.read_text()), str(path)
    shipped = ", ".join(sorted(p.stem for p in SHIPPED_CONFIGS.glob("*.json")))
    raise ConfigError(f"model {cfg.name!r}: no config.json found (model.path, the Hugging Face cache, or "
                      f"conf/model/configs/{cfg.name}.json; shipped: {shipped})")


def _hub_cache_config(hub_id: str) -> Path | None:
    from huggingface_hub import try_to_load_from_cache

    try:
        cached = try_to_load_from_cache(hub_id, "config.json")
    except ValueError:  # not of the form org/name
        return None
    return Path(cached) if isinstance(cached, str) else None


def tiny_architecture(cfg: ModelConfig) -> Architecture:
    """The tiny model as tokenpo.models.loading.build_tiny_model builds it, its vocabulary the tokenizer's."""
    if cfg.tokenizer_from is None:
        vocab = TINY_VOCAB_SIZE  # its built-in byte tokenizer
    else:  # the borrowed tokenizer's model config by name (tokenpo.models.loading imports transformers: seconds)
        tokenizer_model = ModelConfig(name=cfg.tokenizer_from, source="gguf_package")
        vocab = architecture_from_config(*find_config_json(tokenizer_model)).vocab_size
    t = cfg.tiny
    return Architecture(vocab_size=vocab, hidden_size=t.hidden_size, num_layers=t.num_layers, num_heads=t.num_heads,
                        num_kv_heads=t.num_heads, head_dim=t.hidden_size // t.num_heads,
                        intermediate_size=t.intermediate_size, tie_word_embeddings=True, qkv_bias=False,
                        max_position_embeddings=2048, context_length=2048)


def model_architecture(cfg: ModelConfig) -> tuple[Architecture, str]:
    """The policy's architecture and where its numbers come from."""
    if cfg.source == "tiny":
        return tiny_architecture(cfg), "model.tiny"
    config, where = find_config_json(cfg)
    return architecture_from_config(config, where), where

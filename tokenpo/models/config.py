"""Typed schema of the `model` config group."""

from __future__ import annotations

from dataclasses import dataclass, field

from tokenpo.errors import ConfigError
from tokenpo.schema import from_dict

SOURCES = ("gguf_package", "hub", "local", "tiny")
DTYPES = ("float32", "bfloat16", "float16")


@dataclass
class TinyConfig:
    """Shape of the randomly initialised test model (Llama architecture, SmolLM2 tokenizer)."""

    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 4
    intermediate_size: int = 128

    def validate(self) -> None:
        for key in ("hidden_size", "num_layers", "num_heads", "intermediate_size"):
            if getattr(self, key) < 1:
                raise ConfigError(f"model.tiny.{key} must be >= 1, got {getattr(self, key)}")
        # transformers' LlamaConfig rejects these only when the model is built, in a 35-line traceback
        head_dim, rest = divmod(self.hidden_size, self.num_heads)
        if rest or head_dim % 2:
            raise ConfigError(f"model.tiny.num_heads={self.num_heads} must split model.tiny.hidden_size="
                              f"{self.hidden_size} into heads of an even width (rotary embeddings rotate pairs)")


@dataclass
class ModelConfig:
    name: str = "smollm2_135m"
    source: str = "gguf_package"
    hub_id: str | None = None
    path: str | None = None
    gguf_package: str | None = None
    gguf_file: str | None = None
    tokenizer_from: str | None = None
    cache_dir: str = "~/.cache/tokenpo/models"
    dtype: str = "float32"
    attn_implementation: str = "sdpa"
    gradient_checkpointing: bool = False
    trust_remote_code: bool = False
    tiny: TinyConfig = field(default_factory=TinyConfig)

    def validate(self) -> None:
        if self.source not in SOURCES:
            raise ConfigError(f"model.source must be one of {', '.join(SOURCES)}, got {self.source!r}")
        if self.dtype not in DTYPES:
            raise ConfigError(f"model.dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.source == "hub" and not self.hub_id:
            raise ConfigError("model.hub_id is required when model.source=hub")
        if self.source == "local" and not self.path:
            raise ConfigError("model.path is required when model.source=local")
        if self.source == "gguf_package" and not (self.gguf_package and self.gguf_file):
            raise ConfigError("model.gguf_package and model.gguf_file are required when model.source=gguf_package")
        self.tiny.validate()


def model_config_from_dict(d: dict) -> ModelConfig:
    cfg = from_dict(ModelConfig, d, "model")
    cfg.validate()
    return cfg

"""Typed schema of the `model` config group."""

from __future__ import annotations

from dataclasses import dataclass, field

from tokenpo.errors import ConfigError
from tokenpo.schema import from_dict

SOURCES = ("gguf_package", "hub", "local", "tiny")
DTYPES = ("float32", "bfloat16", "float16")
# PEFT's init_lora_weights choices that start with B = 0 on untouched base weights: the adapted model is the base
# model at step 0, so the base with its adapters off is the initial policy (the KL reference). "default" is PEFT's
# True (Kaiming-uniform A); "gaussian" draws A from N(0, 1/r).
LORA_INITS = {"default": True, "gaussian": "gaussian"}
# PEFT's other choices, and why a run refuses them
LORA_INITS_REFUSED = {
    "pissa": "rewrites the base weights", "olora": "rewrites the base weights", "loftq": "rewrites the base weights",
    "corda": "rewrites the base weights", "mica": "rewrites the base weights", "lora_ga": "rewrites the base weights",
    "eva": "needs a pass over data before training", "orthogonal": "starts with B != 0",
    "false": "starts with B != 0",
}
# PEFT's shorthand for every linear layer but the output layer
ALL_LINEAR = "all-linear"


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
class LoraConfig:
    """LoRA adapters (built with PEFT) in place of full fine-tuning; rank 0 trains every weight."""

    rank: int = 0
    alpha: float = 32.0
    dropout: float = 0.0
    target_modules: str | list[str] = ALL_LINEAR
    init: str = "default"
    modules_to_save: list[str] = field(default_factory=list)

    @property
    def enabled(self) -> bool:
        return self.rank > 0

    def settings(self) -> dict | None:
        """What a checkpoint records and a resume must match: None for full fine-tuning."""
        if not self.enabled:
            return None
        return {"rank": self.rank, "alpha": self.alpha, "dropout": self.dropout, "init": self.init,
                "target_modules": self.target_modules if isinstance(self.target_modules, str)
                else sorted(self.target_modules),
                "modules_to_save": sorted(self.modules_to_save)}

    def validate(self) -> None:
        if self.rank < 0:
            raise ConfigError(f"model.lora.rank must be >= 1 (LoRA adapters of that rank) or 0 (full fine-tuning), "
                              f"got {self.rank}")
        if not self.enabled:
            if self.modules_to_save:
                raise ConfigError("model.lora.modules_to_save applies to LoRA runs only: set model.lora.rank >= 1 "
                                  "(with rank 0 every module trains)")
            return
        if self.alpha <= 0:
            raise ConfigError(f"model.lora.alpha must be > 0, got {self.alpha}")
        if not 0 <= self.dropout < 1:
            raise ConfigError(f"model.lora.dropout must be in [0, 1), got {self.dropout}")
        init = str(self.init).lower()
        if init in LORA_INITS_REFUSED or init.startswith("pissa_niter_"):
            why = LORA_INITS_REFUSED.get(init, LORA_INITS_REFUSED["pissa"])
            raise ConfigError(f"model.lora.init={self.init!r} {why}, so the base model with its adapters off would "
                              f"not be the initial policy (the KL reference); use one of {', '.join(LORA_INITS)}")
        if init not in LORA_INITS:
            raise ConfigError(f"model.lora.init must be one of {', '.join(LORA_INITS)}, got {self.init!r}")
        if isinstance(self.target_modules, str) and self.target_modules != ALL_LINEAR:
            raise ConfigError(f"model.lora.target_modules must be {ALL_LINEAR!r} or a list of module names, "
                              f"got {self.target_modules!r}")
        if not self.target_modules:
            raise ConfigError("model.lora.target_modules is empty: name the modules to adapt, or 'all-linear'")


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
    lora: LoraConfig = field(default_factory=LoraConfig)

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
        self.lora.validate()


def model_config_from_dict(d: dict) -> ModelConfig:
    cfg = from_dict(ModelConfig, d, "model")
    cfg.validate()
    return cfg

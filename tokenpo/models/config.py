"""Typed schema of the `model` config group."""

from __future__ import annotations

from dataclasses import dataclass

from tokenpo.schema import build, check_fields, must_be, require, section, setting

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

    hidden_size: int = setting(64, "Hidden width of the random Llama (its model dimension)", ge=1)
    num_layers: int = setting(2, "Decoder layers of the random Llama", ge=1)
    num_heads: int = setting(4,
        "Attention heads of the random Llama (each of width hidden_size / num_heads, an even number)",
        ge=1)
    intermediate_size: int = setting(128, "MLP width of the random Llama", ge=1)

    def validate(self) -> None:
        check_fields(self, "model.tiny")
        # transformers' LlamaConfig rejects these only when the model is built, in a 35-line traceback
        head_dim, rest = divmod(self.hidden_size, self.num_heads)
        require(not rest and head_dim % 2 == 0,
                f"model.tiny.num_heads={self.num_heads} must split model.tiny.hidden_size={self.hidden_size} into "
                "heads of an even width (rotary embeddings rotate pairs)")


@dataclass
class LoraConfig:
    """LoRA adapters (built with PEFT) in place of full fine-tuning; rank 0 trains every weight."""

    rank: int = setting(0,
        'Adapter rank r; 0 = full fine-tuning, every weight trains (verl lora_rank: 0 = off; "LoRA Without Regret", '
        "Schulman et al. 2025: rank 1 matches full fine-tuning in RL)",
        ge=0, requirement=">= 1 (LoRA adapters of that rank) or 0 (full fine-tuning)")
    alpha: float = setting(32.0,
        'Scale numerator: the update is (alpha / r) * B A (PEFT lora_alpha; "LoRA Without Regret" uses 32 with 1/r '
        "scaling)", gt=0)
    dropout: float = setting(0.0,
        "Dropout on the adapter's input in the update's forward, a probability; sampling, old-policy and reference "
        'log-probs and evaluation run without it (PEFT lora_dropout; 0 in "LoRA Without Regret", verl and TRL\'s GRPO)',
        ge=0, lt=1)
    target_modules: str | list[str] = setting(ALL_LINEAR,
        "Modules that get adapters: all-linear = every linear layer of the decoder, attention and MLP, not the output "
        'layer (PEFT\'s "all-linear"; "LoRA Without Regret": MLP layers matter most), or a list of names, '
        'e.g. [q_proj, '
        "v_proj]")
    init: str = setting("default",
        "Initialisation: default (A Kaiming-uniform, B = 0: PEFT init_lora_weights=True) | gaussian (A ~ N(0, 1/r), B ="
        " 0)")
    modules_to_save: list[str] = setting([],
        "Modules trained in full beside the adapters and saved with them (PEFT modules_to_save), e.g. [lm_head]; none")

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
        check_fields(self, "model.lora")
        if not self.enabled:
            require(not self.modules_to_save, "model.lora.modules_to_save applies to LoRA runs only: set "
                                              "model.lora.rank >= 1 (with rank 0 every module trains)")
            return
        init = str(self.init).lower()
        refused = LORA_INITS_REFUSED["pissa"] if init.startswith("pissa_niter_") else LORA_INITS_REFUSED.get(init)
        require(refused is None, f"model.lora.init={self.init!r} {refused}, so the base model with its adapters "
                                 "off would not be the initial policy (the KL reference); use one of "
                                 f"{', '.join(LORA_INITS)}")
        require(init in LORA_INITS, must_be("model.lora.init", f"one of {', '.join(LORA_INITS)}", self.init))
        require(not isinstance(self.target_modules, str) or self.target_modules == ALL_LINEAR,
                must_be("model.lora.target_modules", f"{ALL_LINEAR!r} or a list of module names", self.target_modules))
        require(bool(self.target_modules),
                "model.lora.target_modules is empty: name the modules to adapt, or 'all-linear'")


@dataclass
class ModelConfig:
    name: str = setting("smollm2_135m", "Name of the model (labels, cache folder)")
    source: str = setting("gguf_package", "Where weights come from: gguf_package | hub | local | tiny", choices=SOURCES)
    hub_id: str | None = setting(None, "Hub id used when the package is not installed",
        shipped="the embedded default's weights; a model config without them has none")
    path: str | None = setting(None, "Local Hugging Face folder (source=local)")
    gguf_package: str | None = setting(None, "Python package that ships the GGUF file",
        shipped="the embedded default's weights; a model config without them has none")
    gguf_file: str | None = setting(None, "GGUF file name inside that package",
        shipped="the embedded default's weights; a model config without them has none")
    tokenizer_from: str | None = setting(None,
        "Where to take the tokenizer from when source=tiny (a model config name)")
    cache_dir: str = setting("~/.cache/tokenpo/models", "Cache of converted checkpoints")
    dtype: str = setting("float32",
        "Parameter dtype: float32 | bfloat16 (trains with deepspeed.precision=bf16, which auto picks; slow on CPUs "
        "without AMX); float16 refused", choices=DTYPES)
    attn_implementation: str = setting("sdpa", "Attention kernel: sdpa | eager | flash_attention_2")
    gradient_checkpointing: bool = setting(False, "Trade compute for memory in the backward pass")
    trust_remote_code: bool = setting(False, "Run model code from the hub repo (needed by some architectures)")
    tiny: TinyConfig = section(TinyConfig, "Shape of the random model (only used by source=tiny)")
    lora: LoraConfig = section(LoraConfig,
        "LoRA adapters in place of full fine-tuning (conf/model/lora/default.yaml; off: rank 0)")

    def validate(self) -> None:
        check_fields(self, "model")
        require(self.source != "hub" or bool(self.hub_id), "model.hub_id is required when model.source=hub")
        require(self.source != "local" or bool(self.path), "model.path is required when model.source=local")
        require(self.source != "gguf_package" or bool(self.gguf_package and self.gguf_file),
                "model.gguf_package and model.gguf_file are required when model.source=gguf_package")
        self.tiny.validate()
        self.lora.validate()


def model_config_from_dict(d: dict) -> ModelConfig:
    return build(ModelConfig, d, "model")


# "LoRA Without Regret" (Schulman et al., 2025): LoRA's best learning rate is about this many times full fine-tuning's
LORA_LR_FACTOR = 10


def lora_lr_note(experiment: str | None, rank: int, lr: float, lr_set_by_user: bool) -> str | None:
    """The start-up line of a paper setup (experiment=paper/...) run with LoRA at the setup's full-fine-tuning
    learning rate, which tokenpo does not raise by itself (docs/lora.md); None otherwise."""
    if rank <= 0 or lr_set_by_user or not (experiment or "").startswith("paper/"):
        return None
    return (f"experiment={experiment} with model.lora.rank={rank} keeps the setup's full-fine-tuning trainer.lr={lr:g}; "
            f"LoRA's best is about {LORA_LR_FACTOR}x full fine-tuning's (LoRA Without Regret; docs/lora.md): set "
            f"trainer.lr={LORA_LR_FACTOR * lr:g} to follow it")


def is_flash_attention(implementation: str) -> bool:
    """Whether transformers runs `implementation` (model.attn_implementation) with flash-attention's kernels
    (flash_attention_2, flash_attention_3, a kernels-hub flash-attn)."""
    return "flash" in implementation

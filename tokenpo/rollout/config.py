"""Typed schema of the `rollout` config group."""

from __future__ import annotations

from dataclasses import dataclass, field

from tokenpo.errors import ConfigError
from tokenpo.schema import from_dict

VLLM_DTYPES = ("auto", "float32", "bfloat16", "float16")
# vLLM's sleep levels that free the KV cache: 1 offloads the weights to host memory, 2 discards them
SLEEP_LEVELS = (1, 2)
# what the device-dependent nulls take on CPU (vLLM's CPU backend: a KV cache of fixed size in RAM, no CUDA graphs),
# and vLLM's share of the memory wherever no plan sized it (TRL's colocate default, vllm_gpu_memory_utilization)
CPU_KV_CACHE_GIB = 1.0
DEFAULT_MEMORY_SHARE = 0.3


@dataclass
class VLLMConfig:
    """The `vllm` engine's settings (read only by it; conf/rollout/vllm.yaml says what each one is)."""

    dtype: str = "auto"
    tensor_parallel_size: int = 1
    gpu_memory_utilization: float | None = None
    kv_cache_gib: float | None = None
    enforce_eager: bool | None = None
    max_model_len: int | None = None
    seed: int = 0
    sleep_mode: bool = True
    sleep_level: int = 2

    def validate(self) -> None:
        if self.dtype not in VLLM_DTYPES:
            raise ConfigError(f"rollout.vllm.dtype must be one of {', '.join(VLLM_DTYPES)}, got {self.dtype!r}")
        # colocated, one engine per trainer process: ranks sharing one tensor-parallel engine would have to generate
        # the same groups, which the trainer's split of the groups over ranks does not do yet
        if self.tensor_parallel_size != 1:
            raise ConfigError(f"rollout.vllm.tensor_parallel_size must be 1 (one colocated engine per trainer "
                              f"process; tensor parallelism is not supported yet), got {self.tensor_parallel_size}")
        if self.gpu_memory_utilization is not None and not 0 < self.gpu_memory_utilization <= 1:
            raise ConfigError(f"rollout.vllm.gpu_memory_utilization must be in (0, 1], "
                              f"got {self.gpu_memory_utilization}")
        if self.kv_cache_gib is not None and self.kv_cache_gib <= 0:
            raise ConfigError(f"rollout.vllm.kv_cache_gib must be null or > 0, got {self.kv_cache_gib}")
        if self.sleep_level not in SLEEP_LEVELS:
            raise ConfigError(f"rollout.vllm.sleep_level must be 1 or 2, got {self.sleep_level}")
        if self.max_model_len is not None and self.max_model_len < 1:
            raise ConfigError(f"rollout.vllm.max_model_len must be null or >= 1, got {self.max_model_len}")


@dataclass(frozen=True)
class VLLMSizing:
    """vLLM's memory settings on one device, every null of VLLMConfig resolved."""

    gpu_memory_utilization: float
    kv_cache_bytes: int | None  # None: vLLM sizes its KV cache from gpu_memory_utilization
    enforce_eager: bool


def vllm_sizing(v: VLLMConfig, device: str) -> VLLMSizing:
    """The nulls for `device` (cuda | cpu). On CUDA: CUDA graphs on (vLLM's own default, and verl's and TRL's), and
    the KV cache whatever vLLM's share of the device leaves after its weights and its own activations and graphs
    (vLLM profiles them at start-up); the share is the memory plan's (tokenpo.plan.memory.with_vllm_share fills it
    in before the engine is built), else DEFAULT_MEMORY_SHARE. On CPU: eager, a KV cache of CPU_KV_CACHE_GIB."""
    cuda = device == "cuda"
    kv_cache_gib = v.kv_cache_gib if v.kv_cache_gib is not None or cuda else CPU_KV_CACHE_GIB
    return VLLMSizing(
        gpu_memory_utilization=v.gpu_memory_utilization or DEFAULT_MEMORY_SHARE,
        kv_cache_bytes=None if kv_cache_gib is None else int(kv_cache_gib * 2**30),
        enforce_eager=not cuda if v.enforce_eager is None else v.enforce_eager,
    )


@dataclass
class RolloutConfig:
    engine: str = "hf"
    group_size: int = 4
    max_new_tokens: int = 32
    temperature: float = 1.0
    top_p: float = 1.0
    share_prefill: bool = True
    eos_tokens: tuple = ()
    vllm: VLLMConfig = field(default_factory=VLLMConfig)

    def validate(self) -> None:
        from tokenpo.rollout.engine import ENGINES

        # the name only: an engine's package is needed where it runs (build_engine), not to validate a config
        ENGINES.check(self.engine)
        if self.group_size < 1:
            raise ConfigError(f"rollout.group_size must be >= 1, got {self.group_size}")
        if self.max_new_tokens < 1:
            raise ConfigError(f"rollout.max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ConfigError(f"rollout.temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"rollout.top_p must be in (0, 1], got {self.top_p}")
        self.vllm.validate()


def rollout_config_from_dict(d: dict) -> RolloutConfig:
    cfg = from_dict(RolloutConfig, d, "rollout")
    cfg.validate()
    return cfg


def require_sampler_logprobs(tis_cap: float | None, rollout: RolloutConfig) -> None:
    """Truncated importance sampling (algorithm.loss.tis_cap) weighs tokens by the engine's own log-probs."""
    from tokenpo.rollout.engine import ENGINES

    if tis_cap is not None and not ENGINES.trait(rollout.engine, "logprobs"):
        raise ConfigError(f"algorithm.loss.tis_cap={tis_cap} needs the rollout engine's log-probs, which "
                          f"rollout.engine={rollout.engine} does not return: use rollout=vllm, or tis_cap=null")

"""The rollout engine interface: an object created once per run that turns prompt token ids into responses.

The trainer calls only this interface (`build_engine`, then `generate`, `sleep`, `sync_weights`, `close`; the
order of the calls is docs/rollout.md's "Phase order"):
the `hf` engine generates with the live policy module, the `vllm` engine with its own copy of the weights that
`sync_weights` brings up to date after every policy update. Another engine (SGLang, a remote server) plugs
in by registering a class with the same constructor and methods.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from tokenpo.errors import ConfigError
from tokenpo.registry import Registry

if TYPE_CHECKING:
    import torch

    from tokenpo.deepspeed.config import DeepSpeedConfig
    from tokenpo.rollout.config import RolloutConfig


@dataclass(frozen=True)
class SamplingParams:
    num_samples: int
    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    stop_token_ids: tuple[int, ...] = ()
    share_prefill: bool = True
    logprobs: bool = False  # return each sampled token's log-prob under the sampling temperature (hf engine)


@dataclass
class Responses:
    """Responses ordered prompt-major: the samples of prompt i are rows i*G .. i*G+G-1."""

    token_ids: list[list[int]]
    truncated: list[bool]
    # log-probs of the sampled tokens under the sampling distribution, where the engine has them
    logprobs: list[list[float]] | None = None
    # the policy version that sampled each token, where a response spans several (a partial rollout continued on
    # newer weights); None: every token by the request's version
    token_versions: list[list[int]] | None = None


class RolloutEngine(Protocol):
    """What the trainer calls; built by `build_engine(cfg, policy, tokenizer, deepspeed_cfg)`."""

    def generate(self, prompt_ids: list[list[int]], params: SamplingParams, generator: torch.Generator) -> Responses:
        """Responses to `prompt_ids`; all randomness is drawn from `generator` (a resumed run samples the same)."""

    def sync_weights(self, policy) -> None:
        """Bring the engine's weights to the policy's (a DeepSpeed engine or a module), and wake it up: the only
        way to wake an engine whose sleep discarded its weights (vLLM's level 2)."""

    def sleep(self) -> None:
        """Release the engine's memory, where it can, for a pass that trains (the worst-case pass, each update);
        the trainer syncs after each such pass, which wakes it."""

    def wake_up(self) -> None:
        """Take back what `sleep` released, if the weights were kept (generate wakes a sleeping engine by itself)."""

    def close(self) -> None:
        """Free the engine for good."""


def seeded_generator(seed: int, device: torch.device | str) -> torch.Generator:
    """The random stream a generate call draws from, seeded, on the device the engine's model samples on: sampling
    draws its numbers on the logits' device, and a CPU generator beside CUDA logits fails at the first sample."""
    import torch

    return torch.Generator(device=device).manual_seed(seed)


ENGINES = Registry("rollout.engine")
# declared here and registered by their modules, which import transformers or vLLM only when an engine is built
ENGINES.declare("hf", "tokenpo.rollout.hf")
ENGINES.declare("vllm", "tokenpo.rollout.vllm_engine", requires="vllm", logprobs=True)


def get_engine(name: str) -> type:
    """The engine class registered as `name`; one that needs a package not installed here is a ConfigError."""
    package = ENGINES.trait(name, "requires")
    if package and importlib.util.find_spec(package) is None:
        raise ConfigError(f"rollout.engine={name} needs the {package!r} package, which this Python does not have: "
                          f"run with the environment `bash scripts/setup_vllm.sh` prints (docs/rollout.md)")
    return ENGINES.get(name)


def build_engine(cfg: RolloutConfig, policy, tokenizer, deepspeed: DeepSpeedConfig | None = None) -> RolloutEngine:
    """The run's engine for `policy` (a DeepSpeed engine, or a plain module for evaluation)."""
    return get_engine(cfg.engine)(cfg, policy, tokenizer, deepspeed)

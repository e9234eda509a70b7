"""The rollout engines: the sampling types (`SamplingParams`, `Responses`), the registry of engines, and
`build_generator`, which builds the run's `Generator` (tokenpo.rollout.generator, the one interface the trainer
calls; the order of the calls is docs/rollout.md's "Phase order").

The `hf` engine generates with the live policy module that `Policy.publish` lends it, the `vllm` engine with its own
copy of the weights that each `load` brings up to date; with rollout.async.max_staleness >= 1 either runs in a
process of its own ahead of the update (tokenpo.rollout.ahead), and the evaluations are sampled by the `hf` engine in
the trainer's process (the live policy) or by the `vllm` engine in that process (no second vLLM beside the trainer).
The `vllm_server` engine generates on vLLM servers of their own (tokenpo.rollout.server), in turn or ahead.
Another engine (SGLang, another server) plugs in by registering a class with the engines' constructor
`(cfg: RolloutConfig, tokenizer, published: Published, device)` that implements `Generator`; one that starts
servers may define `start_early(cfg, model: ModelConfig)`, whose result (with a `close`) the trainer calls before
the policy's model loads and hands the constructor as a fifth argument.
"""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tokenpo.errors import ConfigError
from tokenpo.registry import Registry

if TYPE_CHECKING:
    import torch

    from tokenpo.models.config import ModelConfig
    from tokenpo.rollout.config import RolloutConfig
    from tokenpo.rollout.generator import Generator, Published


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


def seeded_generator(seed: int, device: torch.device | str) -> torch.Generator:
    """The random stream a generate call draws from, seeded, on the device the engine's model samples on: sampling
    draws its numbers on the logits' device, and a CPU generator beside CUDA logits fails at the first sample."""
    import torch

    return torch.Generator(device=device).manual_seed(seed)


ENGINES = Registry("rollout.engine")
# declared here and registered by their modules, which import transformers or vLLM only when an engine is built
# ahead: how an engine generates ahead of the update (rollout.async.max_staleness >= 1): "process" in a generator
# process of tokenpo's (tokenpo.rollout.ahead), "itself" on servers of its own; none: it cannot.
# Where it generates, for the memory plan (tokenpo.plan): policy_module, with the trainer's live policy module (its
# KV cache on the trainer's device, the whole model gathered under ZeRO-3); colocated, in an engine of its own beside
# the trainer on the trainer's device (its share of the device); servers, on servers of its own (sized apart).
# vllm_model: vLLM runs it with rollout.vllm's model settings, max_model_len among them
ENGINES.declare("hf", "tokenpo.rollout.hf", ahead="process", policy_module=True)
ENGINES.declare("vllm", "tokenpo.rollout.vllm_engine", requires="vllm", logprobs=True, ahead="process",
                colocated=True, vllm_model=True)
ENGINES.declare("vllm_server", "tokenpo.rollout.server.engine", logprobs=True, ahead="itself", servers=True,
                vllm_model=True)


def get_engine(name: str) -> type:
    """The engine class registered as `name`; one that needs a package not installed here is a ConfigError."""
    package = ENGINES.trait(name, "requires")
    if package and importlib.util.find_spec(package) is None:
        raise ConfigError(f"rollout.engine={name} needs the {package!r} package, which this Python does not have: "
                          f"run with the environment `bash scripts/setup_vllm.sh` prints (docs/rollout.md)")
    return ENGINES.get(name)


@contextlib.contextmanager
def started_early(cfg: RolloutConfig, model: ModelConfig) -> Iterator[object | None]:
    """What the engine starts before the policy's model loads, for `build_generator` (an engine's optional
    `start_early(cfg, model)`: a server engine's servers, which then boot while the trainer loads); closed at the
    end (the engine that took it has closed it by then; a run that failed before has not)."""
    start = getattr(get_engine(cfg.engine), "start_early", None)
    early = start(cfg, model) if start is not None else None
    try:
        yield early
    finally:
        if early is not None:
            early.close()


def build_generator(cfg: RolloutConfig, tokenizer, published: Published, device: torch.device,
                    world_size: int = 1, early: object | None = None) -> Generator:
    """The run's generator, holding `published` (the policy before training, or the model evaluated): the engine
    rollout.engine names (given what `started_early` started, if anything), and with rollout.async.max_staleness
    >= 1, for an engine that runs in a generator process, that process (tokenpo.rollout.ahead), with the engine in
    this process for the evaluations where it generates with the live policy module (else the process samples them:
    no second copy of its weights here)."""
    engine = get_engine(cfg.engine)
    if not cfg.async_.max_staleness or ENGINES.trait(cfg.engine, "ahead") != "process":
        return engine(cfg, tokenizer, published, device, *([early] if early is not None else []))
    from tokenpo.rollout.ahead import AheadGenerator, WorkerSettings

    local = engine(cfg, tokenizer, published, device) if ENGINES.trait(cfg.engine, "policy_module") else None
    return AheadGenerator(WorkerSettings.from_config(cfg, tokenizer, world_size), local, published)

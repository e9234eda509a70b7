"""What every step of a run reads: the config, the models, the rollout engine, the reward, the sampler."""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import torch

from tokenpo.config import TrainConfig
from tokenpo.data import DataConfig, Example, PromptSampler
from tokenpo.data.prompts import capped_prompt_ids
from tokenpo.deepspeed import dist
from tokenpo.evaluation.benchmark import stop_token_ids
from tokenpo.models.lora import adapters_disabled, is_lora
from tokenpo.rewards import RewardConfig, RewardScorer
from tokenpo.rollout.engine import RolloutEngine, SamplingParams, build_engine


class Timings:
    """Seconds spent per phase in the current step: `with timings("generate"): ...`."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)

    @contextlib.contextmanager
    def __call__(self, phase: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[phase] += time.perf_counter() - start


@dataclass
class RunContext:
    """Everything a step needs; built once per run by `RunContext.create`."""

    cfg: TrainConfig
    run_dir: Path
    tokenizer: object
    policy: object  # the DeepSpeed engine
    reference: object | None  # the frozen copy of the initial policy; None without a KL term, or with LoRA
    scorer: RewardScorer | None
    sampler: PromptSampler | None
    device: torch.device
    rollout_engine: RolloutEngine
    reward: RewardConfig  # how training answers are judged (cfg.reward_for(cfg.data))
    stop_token_ids: list[int]
    timings: Timings = field(default_factory=Timings)
    prompt_cache: dict[tuple, list[int]] = field(default_factory=dict)

    @classmethod
    def create(cls, cfg: TrainConfig, run_dir: Path, tokenizer, policy, reference, scorer: RewardScorer | None,
               sampler: PromptSampler | None, device: torch.device,
               rollout_engine: RolloutEngine | None = None) -> RunContext:
        """The context with what follows from the config; the rollout engine is built from cfg.rollout when not
        given (train() builds it itself to close it at the end)."""
        if rollout_engine is None:
            rollout_engine = build_engine(cfg.rollout, policy, tokenizer, cfg.deepspeed)
        return cls(cfg, run_dir, tokenizer, policy, reference, scorer, sampler, device, rollout_engine,
                   cfg.reward_for(cfg.data), stop_token_ids(tokenizer, cfg.rollout.eos_tokens))

    def reference_model(self) -> contextlib.AbstractContextManager:
        """Context giving the KL reference policy to run: the frozen copy where one was built, else (LoRA) the policy's
        own module with its adapters switched off, which is the initial policy (adapters start at B = 0)."""
        if self.reference is not None:
            return contextlib.nullcontext(self.reference)
        module = self.policy.module
        if not is_lora(module):
            raise RuntimeError("the KL term needs a reference model: build one (deepspeed.engine.build_reference) "
                               "or train LoRA adapters (model.lora.rank >= 1)")
        return _as_reference(module)

    def prompt_ids(self, example: Example, data: DataConfig | None = None) -> list[int]:
        """The prompt under the template and prompt cap of `data` (default: the training data config)."""
        data = data or self.cfg.data
        key = (example.uid, example.problem, id(data))
        if key not in self.prompt_cache:
            self.prompt_cache[key] = capped_prompt_ids(example.problem, self.tokenizer, data)
        return self.prompt_cache[key]

    def sampling_params(self) -> SamplingParams:
        r = self.cfg.rollout
        return SamplingParams(r.group_size, r.max_new_tokens, r.temperature, r.top_p, self.stop_token_ids,
                              r.share_prefill)

    def rollout_generator(self, step: int, round_index: int) -> torch.Generator:
        """Sampling randomness depends only on (seed, step, round, rank): a resumed run samples the same."""
        seed = ((self.cfg.seed * 100_003 + step) * 101 + round_index) * 1009 + dist.rank()
        return torch.Generator(device=self.device).manual_seed(seed)

    def logprob_temperature(self) -> float:
        """Log-probs and entropy are taken under the sampling temperature (greedy rollouts: 1)."""
        return self.cfg.rollout.temperature or 1.0

    def generate(self, prompt_ids, params, generator):
        return self.rollout_engine.generate(prompt_ids, params, generator)


@contextlib.contextmanager
def _as_reference(module):
    with adapters_disabled(module):
        yield module

"""Rollout engines (config group `rollout`): prompt token ids in, response token ids out."""

from tokenpo.rollout import hf, vllm_engine  # noqa: F401  (register the `hf` and `vllm` engines)
from tokenpo.rollout.engine import ENGINES, Responses, RolloutEngine, SamplingParams, build_engine, get_engine

__all__ = ["ENGINES", "Responses", "RolloutEngine", "SamplingParams", "build_engine", "get_engine"]

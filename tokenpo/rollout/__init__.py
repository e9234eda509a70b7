"""Rollout engines (config group `rollout`): prompt token ids in, response token ids out."""

from tokenpo.rollout import hf  # noqa: F401  (registers the `hf` engine)
from tokenpo.rollout.engine import ENGINES, Responses, SamplingParams, get_engine

__all__ = ["ENGINES", "Responses", "SamplingParams", "get_engine"]

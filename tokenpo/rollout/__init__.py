"""Rollout engines (config group `rollout`): prompt token ids in, response token ids out."""

from tokenpo.rollout.engine import ENGINES, Responses, RolloutEngine, SamplingParams, build_engine, get_engine

__all__ = ["ENGINES", "Responses", "RolloutEngine", "SamplingParams", "build_engine", "get_engine"]

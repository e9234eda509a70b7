"""Rollout engines (config group `rollout`): prompt token ids in, response token ids out, behind one `Generator`."""

from tokenpo.rollout.engine import ENGINES, Responses, SamplingParams, build_generator, get_engine
from tokenpo.rollout.generator import Generator

__all__ = ["ENGINES", "Generator", "Responses", "SamplingParams", "build_generator", "get_engine"]

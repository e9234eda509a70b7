"""Memory plan of a run, from its config and the model's config.json alone: `python -m tokenpo.plan`."""

from tokenpo.plan.memory import MemoryPlan, build_plan
from tokenpo.plan.units import format_bytes, parse_bytes

__all__ = ["MemoryPlan", "build_plan", "format_bytes", "parse_bytes"]

"""Benchmarks of tokenpo's RL step, alone or against TRL's GRPOTrainer (`python -m tokenpo.bench`)."""

from tokenpo.bench.cli import main

__all__ = ["main"]

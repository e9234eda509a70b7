"""Compare tokenpo runs: `python -m tokenpo.compare <multirun dir or run dirs…>` (console script tokenpo-compare)."""

from tokenpo.compare.cli import main

__all__ = ["main"]

"""Seconds per phase of a step (logged as timing/<phase>_s)."""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict


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

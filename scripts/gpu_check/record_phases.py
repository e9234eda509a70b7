"""`python -m tokenpo.train` with every torch.cuda.empty_cache call recorded, in order, as one JSON line each in the
file $GPU_CHECK_PHASES: the tokenpo functions on the stack when it was called (innermost first) and torch's
reserved CUDA bytes before and after. The GPU check's memory-phases part reads the order of the engine's phases
(generate, worst-case pass, update) from it. The patch is made before tokenpo is imported, so a `from torch.cuda
import empty_cache` inside tokenpo gets it too."""

from __future__ import annotations

import json
import os
import sys
import time

import torch

RECORD = os.environ["GPU_CHECK_PHASES"]
original_empty_cache = torch.cuda.empty_cache


def reserved() -> int:
    return torch.cuda.memory_reserved() if torch.cuda.is_initialized() else 0


def tokenpo_callers(frame) -> list[str]:
    """module.function of each tokenpo frame from `frame` outwards."""
    names = []
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if module.startswith("tokenpo."):
            names.append(f"{module.removeprefix('tokenpo.')}.{frame.f_code.co_qualname}")
        frame = frame.f_back
    return names


def recorded_empty_cache() -> None:
    before = reserved()
    original_empty_cache()
    callers = tokenpo_callers(sys._getframe(1))
    event = {"time": time.time(), "caller": callers[0] if callers else "outside tokenpo", "stack": callers[:6],
             "reserved_before": before, "reserved_after": reserved()}
    with open(RECORD, "a") as stream:
        stream.write(json.dumps(event) + "\n")


torch.cuda.empty_cache = recorded_empty_cache

if __name__ == "__main__":
    from tokenpo.train import main

    main()

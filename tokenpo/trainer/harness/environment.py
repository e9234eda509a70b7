"""What a run's numbers depend on beyond its config and seed: the processor, the instruction set PyTorch's kernels
use, the thread count, the number of processes and the library versions. Two runs of one config and seed give the
same numbers only where all of these match (floats are summed in another order otherwise, and sampling drifts)."""

from __future__ import annotations

import json
import logging
import platform
from importlib import metadata
from pathlib import Path

log = logging.getLogger("tokenpo")

ENVIRONMENT_FILE = "environment.json"
# the libraries whose kernels or defaults change a run's floats
LIBRARIES = ("torch", "transformers", "deepspeed")


def processor_name(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's model name (Linux /proc/cpuinfo), else what the platform reports."""
    if cpuinfo.is_file():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and value.strip():
                return value.strip()
    return platform.processor() or platform.machine()


def library_version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def numerics_environment(world_size: int) -> dict[str, str | int]:
    """The run's numerics environment, written to <run dir>/environment.json and shown by tokenpo.compare."""
    import torch  # here, not at the top: tokenpo.compare reads ENVIRONMENT_FILE without loading torch

    return {
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else processor_name(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "threads": torch.get_num_threads(),
        "processes": world_size,
        **{name: library_version(name) for name in LIBRARIES},
    }


def read_environments(run_dir: Path) -> list[dict] | None:
    """The starts recorded in <run dir>/environment.json: [] when there is none, None when it is unreadable (not
    a JSON list of objects)."""
    path = run_dir / ENVIRONMENT_FILE
    if not path.is_file():
        return []
    try:
        starts = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    return starts if isinstance(starts, list) and all(isinstance(start, dict) for start in starts) else None


def record_environment(run_dir: Path, start_step: int, world_size: int) -> None:
    """Append this start's environment to <run dir>/environment.json, a list with one entry per start (a resumed
    run keeps the earlier starts', so a resume on another machine shows in the record)."""
    starts = read_environments(run_dir)
    if starts is None:
        log.warning("%s is not a JSON list of starts: replaced by this start's environment", run_dir / ENVIRONMENT_FILE)
        starts = []
    starts.append({"from_step": start_step, **numerics_environment(world_size)})
    (run_dir / ENVIRONMENT_FILE).write_text(json.dumps(starts, indent=1))

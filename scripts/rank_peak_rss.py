"""Peak resident memory of each rank of a training run: `python scripts/rank_peak_rss.py [--until-first-step]
<tokenpo.train overrides>`.

Runs `python -m tokenpo.train <overrides>` and polls its processes' VmHWM (the kernel's high-water mark of resident
memory, /proc/<pid>/status) until it exits; prints one line per rank (processes with RANK in their environment).
`--until-first-step` also prints each rank's VmHWM before the policy's optimizer is built (model and KL reference
loaded) and as its first step starts (engines and data too): the loading cost, read inside the worker, where a
generated sitecustomize on PYTHONPATH wraps those calls of the loop.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

# the folder where each worker writes <mark>.rank<N>: its VmHWM in MiB before that call
SETUP_DIR = "RANK_PEAK_RSS_SETUP_DIR"
# the trainer's calls before which a worker records its VmHWM: models and KL reference (engine) loaded, the policy's
# optimizer and engine not yet built (tokenpo.trainer.core.policy); everything built, the first step starting
# (tokenpo.trainer.core.step)
MARKS = {"build_optimizer": "the policy's optimizer", "collect_rollouts": "the first step"}
MARK_MODULES = {"build_optimizer": "policy", "collect_rollouts": "step"}  # the tokenpo.trainer module calling each


def high_water_mib(pid: int) -> float:
    """The process's peak resident set so far, in MiB."""
    with open(f"/proc/{pid}/status") as status:
        line = next(line for line in status if line.startswith("VmHWM:"))
    return int(line.split()[1]) / 1024


def record_at_marks() -> None:
    """Run by the generated sitecustomize in every process: in a worker of a run with SETUP_DIR set, the first call
    of each of the MARKS first writes the worker's VmHWM."""
    if SETUP_DIR not in os.environ or "RANK" not in os.environ:
        return
    import importlib

    for name in MARKS:
        # the trainer calls these by its modules' own names
        module = importlib.import_module(f"tokenpo.trainer.{MARK_MODULES[name]}")
        out = Path(os.environ[SETUP_DIR]) / f"{name}.rank{os.environ['RANK']}"
        setattr(module, name, recording(getattr(module, name), out))


def recording(fn, out: Path):
    """`fn`, whose first call first writes this process's VmHWM (MiB) to `out`."""

    def record_then_call(*args, **kwargs):
        if not out.exists():
            out.write_text(f"{high_water_mib(os.getpid()):.0f}")
        return fn(*args, **kwargs)

    return record_then_call


def hooked_env(hook_dir: Path) -> dict[str, str]:
    """The run's environment with hook_dir's sitecustomize (and this script's folder, which it imports) first."""
    (hook_dir / "sitecustomize.py").write_text("import rank_peak_rss\nrank_peak_rss.record_at_marks()\n")
    path = [str(hook_dir), str(Path(__file__).resolve().parent), os.environ.get("PYTHONPATH", "")]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, path)), **{SETUP_DIR: str(hook_dir)})


def main(args: list[str]) -> int:
    until_first_step = args[:1] == ["--until-first-step"]
    with tempfile.TemporaryDirectory() as hook_dir:
        code = poll_peaks(args[until_first_step:], hooked_env(Path(hook_dir)) if until_first_step else None)
        for name, label in MARKS.items():
            for out in sorted(Path(hook_dir).glob(f"{name}.rank*")):
                print(f"rank {out.suffix[5:]}: peak RSS until {label} {out.read_text()} MiB")
    return code


def poll_peaks(overrides: list[str], env: dict[str, str] | None) -> int:
    """Run tokenpo.train, print each rank's whole-run peak RSS; the run's exit status."""
    run = subprocess.Popen([sys.executable, "-m", "tokenpo.train", *overrides], env=env)
    root, peaks = psutil.Process(run.pid), {}
    while run.poll() is None:
        for proc in root.children(recursive=True):
            try:
                rank = proc.environ().get("RANK")
                if rank is not None:
                    peaks[int(rank)] = max(peaks.get(int(rank), 0.0), high_water_mib(proc.pid))
            except (psutil.Error, OSError, StopIteration):  # a process that just exited or is not ours to read
                pass
        time.sleep(0.2)
    for rank, peak in sorted(peaks.items()):
        print(f"rank {rank}: peak RSS {peak:.0f} MiB")
    return run.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

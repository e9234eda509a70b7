"""Peak resident memory of the main job with LoRA rank 8 against full fine-tuning (docs/lora.md).

    python scripts/bench_lora_memory.py                     # 3 steps each, eval off; prints both peaks and the ratio
    python scripts/bench_lora_memory.py --runs 2 --json docs/data/bench/lora_memory.json
    python scripts/bench_lora_memory.py --rank 16 -- rollout.temperature=1.0   # other rank; extra overrides after --

Each configuration runs `python -m tokenpo.train` (the embedded default: SmolLM2-135M on arithmetic, one process)
with `trainer.max_steps=3 eval.every_steps=0 eval.before_training=false logger.mode=disabled` and, as the main-job
rows of scripts/plan_vs_measured.py, `rollout.temperature=10` (near-uniform sampling: every response runs to
max_new_tokens, so both runs meet the same, largest shapes at every step), in a fresh process, one after the other.
Inside that process the heavy libraries (torch, transformers, DeepSpeed, PEFT) are imported first, its resident
memory is read (the libraries' baseline) and the kernel's high-water mark reset; after the run the high-water mark is
read again. Two figures per run: `peak` (the whole process, libraries included: what `/usr/bin/time` reports) and
`above_libraries` (peak minus the baseline: the figure docs/lora.md quotes). As in plan_vs_measured.py, glibc returns
freed blocks over 128 KiB at once (MALLOC_MMAP_THRESHOLD_), so resident memory follows the live tensors.

The LoRA/full ratio of the whole-process peaks is the check: at most 0.80 (issue 40 item 7).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MAIN_JOB = ["trainer.max_steps=3", "eval.every_steps=0", "eval.before_training=false", "logger.mode=disabled",
            "trainer.print_samples=0", "rollout.temperature=10"]
LIMIT = 0.80  # LoRA's whole-process peak over full fine-tuning's, at most
MIB = 2**20


def status_bytes(key: str) -> int:
    """VmRSS (resident now) or VmHWM (peak resident since the last reset) of this process."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{key}:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {key} in /proc/self/status")


def measure(out: Path, overrides: list[str]) -> None:
    """In the fresh process: the libraries, their baseline, `python -m tokenpo.train <overrides>`, the peak."""
    import deepspeed  # noqa: F401  (the heavy imports, before the baseline)
    import peft  # noqa: F401
    import torch  # noqa: F401
    import transformers  # noqa: F401

    import tokenpo.train

    from tokenpo.trainer.core.policy import Policy

    marks = {}
    export = Policy.export

    def export_after_mark(self, *args, **kwargs):
        """The run's export of the final policy, its peak apart from the training's (VmHWM reset before it)."""
        marks["training"] = status_bytes("VmHWM")
        marks["before_export"] = status_bytes("VmRSS")
        Path("/proc/self/clear_refs").write_text("5")
        return export(self, *args, **kwargs)

    Policy.export = export_after_mark
    import_peak = status_bytes("VmHWM")
    baseline = status_bytes("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM restarts from VmRSS: the imports' transients forgotten
    sys.argv = ["tokenpo.train", *overrides]
    try:
        tokenpo.train.main()
    except SystemExit as exit_:
        if exit_.code:
            raise
    last = status_bytes("VmHWM")  # since the export started (since the baseline, had there been none)
    training = marks.get("training", last)
    export_peak = last if "training" in marks else None
    peak = max(import_peak, training, export_peak or 0)
    out.write_text(json.dumps({
        "baseline": baseline, "peak": peak, "above_libraries": peak - baseline,
        # where the peak was: the 3 steps (model, engine, rollouts, updates), or the export of final/ after them
        "training_peak": training, "before_export": marks.get("before_export"), "export_peak": export_peak}))


def run_one(overrides: list[str], work: Path) -> dict:
    env = dict(os.environ, WANDB_MODE="disabled", MALLOC_MMAP_THRESHOLD_="131072",
               PYTHONPATH=os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]))
    out, log = work / "peak.json", work / "run.log"
    args = [*overrides, f"hydra.run.dir={work / 'run'}"]
    start = time.perf_counter()
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    with open(log, "w") as stderr:
        code = subprocess.call([sys.executable, __file__, "--measure", str(out), "--", *args], cwd=REPO, env=env,
                               stdout=stderr, stderr=subprocess.STDOUT)
    if code:
        raise RuntimeError(f"run {' '.join(overrides)} failed ({code}):\n{log.read_text()[-4000:]}")
    result = json.loads(out.read_text())
    # the kernel's own count of the largest child's peak, a cross-check of `peak` (kB on Linux)
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    result["ru_maxrss_children"] = children * 1024 if children > before else None
    result["seconds"] = round(time.perf_counter() - start, 1)
    return result


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--measure":
        measure(Path(sys.argv[2]), sys.argv[4:])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rank", type=int, default=8, help="LoRA rank (default 8)")
    parser.add_argument("--runs", type=int, default=1, help="runs of each configuration (median reported)")
    parser.add_argument("--json", type=Path, help="also write the measurements here")
    parser.add_argument("--only", choices=("full", "lora"), help="run one of the two configurations only")
    parser.add_argument("--keep", type=Path, help="copy each run's metrics.jsonl here (<config>-<run>.jsonl)")
    parser.add_argument("overrides", nargs="*", help="extra tokenpo.train overrides for both runs (after --)")
    args = parser.parse_args()
    configs = {"full": [*MAIN_JOB, *args.overrides],
               f"lora{args.rank}": [*MAIN_JOB, *args.overrides, f"model.lora.rank={args.rank}"]}
    if args.only:
        configs = {name: o for name, o in configs.items() if name.startswith(args.only)}
    runs: dict[str, list[dict]] = {name: [] for name in configs}
    with tempfile.TemporaryDirectory(prefix="bench_lora_memory-") as tmp:
        for i in range(args.runs):
            for name, overrides in configs.items():
                work = Path(tmp) / f"{name}-{i}"
                work.mkdir()
                runs[name].append(run_one(overrides, work))
                r = runs[name][-1]
                if args.keep:
                    args.keep.mkdir(parents=True, exist_ok=True)
                    shutil.copy(work / "run" / "metrics.jsonl", args.keep / f"{name}-{i}.jsonl")
                print(f"{name} run {i + 1}: peak {r['peak'] / MIB:.0f} MiB, above the libraries "
                      f"{r['above_libraries'] / MIB:.0f} MiB ({r['seconds']:.0f} s)", file=sys.stderr, flush=True)
    median = {name: {key: statistics.median(r[key] for r in rs) for key in ("peak", "above_libraries", "baseline")}
              for name, rs in runs.items()}
    print(f"{'':10} {'peak (MiB)':>11} {'above libraries (MiB)':>22} {'training (MiB)':>15} {'export (MiB)':>13}")
    for name, rs in runs.items():
        m, last = median[name], rs[-1]
        export = f"{last['export_peak'] / MIB:13.0f}" if last.get("export_peak") else f"{'-':>13}"
        print(f"{name:10} {m['peak'] / MIB:11.0f} {m['above_libraries'] / MIB:22.0f} "
              f"{last['training_peak'] / MIB:15.0f} {export}")
    ratio = ratio_libraries = None
    if "full" in median and len(median) == 2:
        full, lora = median["full"], median[f"lora{args.rank}"]
        ratio, ratio_libraries = lora["peak"] / full["peak"], lora["above_libraries"] / full["above_libraries"]
        print(f"saving     {(full['peak'] - lora['peak']) / MIB:11.0f} "
              f"{(full['above_libraries'] - lora['above_libraries']) / MIB:22.0f}")
        print(f"ratio      {ratio:11.3f} {ratio_libraries:22.3f}   "
              f"({'within' if ratio <= LIMIT else 'OVER'} the {LIMIT:.2f} limit; median of {args.runs} run(s) each)")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "command": "python scripts/bench_lora_memory.py " + " ".join(sys.argv[1:]),
            "overrides": configs, "runs": runs, "median": median, "ratio_peak": ratio,
            "ratio_above_libraries": ratio_libraries,
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        }, indent=1) + "\n")


if __name__ == "__main__":
    main()

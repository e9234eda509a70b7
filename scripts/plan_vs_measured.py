"""tokenpo.plan's total against the measured peak memory of training processes on CPU (docs/performance.md).

Each row trains two steps with the worst case first (the largest shapes: the longest prompts, every response at
max_new_tokens, the largest micro-batch), in fresh processes (trainer.nproc of them, gloo). A process measures its
peak resident memory (VmHWM, reset after the heavy imports and the config's composition) minus its resident
memory then, so the libraries' own memory is left out; the plan is computed for the prompt length the worst-case pass met.

    .venv/bin/python scripts/plan_vs_measured.py                # the table (about 1.5 h here on 2 shared cores)
    .venv/bin/python scripts/plan_vs_measured.py --rows 0,3     # some rows
    .venv/bin/python scripts/plan_vs_measured.py --rows 11,12,13,14 --json out.json   # the main job's shapes (~10 min a row)

A row's JSON keeps each rank's whole-process peak (`peak`, libraries included) beside the measured figure.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BASE = ["logger.mode=disabled", "trainer.max_steps=2", "trainer.worst_case_first=true", "trainer.print_samples=0",
        # eval problems >= processes: under ZeRO-3 a rank with no problem to generate for breaks the collectives
        "eval.before_training=false", "eval.max_problems=2", "reward.num_workers=1", "trainer.threads=1"]
TINY = ["model=tiny", "data.prompts_per_step=4", "rollout.group_size=4"]
# the tiny model with SmolLM2's 49152-token vocabulary: an output layer as wide as real models' (relative to width)
TINY_49K = [*TINY, "model.tokenizer_from=smollm2_135m"]
# temperature 10: near-uniform sampling, so (as the random tiny model's) every response runs to max_new_tokens and
# step 2 meets the worst shapes with the optimizer states allocated (AdamW creates them at step 1's update)
SMOL = ["model=smollm2_135m", "data.prompts_per_step=2", "rollout.group_size=2", "rollout.temperature=10"]
# the main job's model and batch (8 prompts x 4 x 32 tokens, one 32-sequence micro-batch), 3 steps; temperature 10 as
# above, so every step meets the worst shapes
MAIN = ["model=smollm2_135m", "rollout.temperature=10", "trainer.max_steps=3"]
# (label, model overrides, ZeRO stage, processes, max_new_tokens, activation checkpointing, other overrides)
ROWS = [
    ("tiny", TINY, 0, 1, 32, False, []),
    ("tiny", TINY, 2, 2, 512, True, []),
    ("tiny-49k", TINY_49K, 0, 1, 128, False, []),
    ("tiny-49k", TINY_49K, 0, 1, 256, False, []),
    ("tiny-49k", TINY_49K, 0, 1, 256, False, ["trainer.recompute_head=true"]),
    ("tiny-49k", TINY_49K, 1, 2, 128, False, []),
    ("tiny-49k", TINY_49K, 3, 2, 128, True, []),
    ("135M", SMOL, 0, 1, 32, False, []),
    ("135M", SMOL, 0, 1, 64, True, []),
    ("135M", SMOL, 2, 2, 32, False, []),
    ("135M", SMOL, 3, 2, 32, True, []),
    ("135M main", MAIN, 0, 1, 32, False, []),
    ("135M main", MAIN, 0, 1, 32, False, ["model.lora.rank=8"]),
    ("135M main", MAIN, 0, 1, 32, True, []),
    ("135M main", MAIN, 0, 1, 32, False, ["rollout.group_size=8"]),
    ("135M main", MAIN, 2, 2, 32, False, []),
]


def status_bytes(key: str) -> int:
    """VmRSS (resident now) or VmHWM (peak resident since the last reset) of this process."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{key}:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {key} in /proc/self/status")


def measure(overrides: list[str], run_dir: Path, out: Path) -> None:
    """One rank: train, then write {baseline, peak, prompt_tokens, plan} to `out`."""
    import deepspeed  # noqa: F401  (the heavy imports, before the baseline)
    import torch  # noqa: F401
    import transformers  # noqa: F401
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from tokenpo import CONF_DIR
    from tokenpo.config import build_config
    from tokenpo.deepspeed import dist
    from tokenpo.plan import build_plan
    from tokenpo.trainer.harness import loop
    from tokenpo.trainer.harness.identity import RunIdentity

    with initialize_config_dir(CONF_DIR, version_base="1.3"):
        tree = compose("train", overrides=overrides)
    cfg, resolved = build_config(tree), OmegaConf.to_container(tree, resolve=True)
    met = {}
    worst_case = loop.run_worst_case

    def recorded(*args):
        met["shapes"] = worst_case(*args)
        return met["shapes"]

    loop.run_worst_case = recorded
    run_dir.mkdir(parents=True, exist_ok=True)
    baseline = status_bytes("VmRSS")
    # the peak so far (the imports' transient allocations) is forgotten: VmHWM restarts from VmRSS
    Path("/proc/self/clear_refs").write_text("5")
    loop.train(cfg, RunIdentity(run_dir, "plan_vs_measured", "plan", resolved))
    peak = status_bytes("VmHWM")
    plan = build_plan(cfg, dist.world_size(), None, met["shapes"].prompt_tokens, device="cpu")
    out.write_text(json.dumps({"baseline": baseline, "peak": peak, "prompt_tokens": met["shapes"].prompt_tokens,
                               "plan": plan.as_json()}))


def run_row(row, work: Path) -> dict:
    from tokenpo.deepspeed.dist import free_port
    from tokenpo.trainer.processes.launch import worker_env

    label, model, stage, nproc, new_tokens, ckpt, extra = row
    overrides = [*BASE, *model, f"deepspeed=zero{stage}", f"rollout.max_new_tokens={new_tokens}",
                 f"model.gradient_checkpointing={str(ckpt).lower()}", *extra]
    port, procs = free_port(), []
    start = time.perf_counter()
    for rank in range(nproc):
        env = worker_env(rank, nproc, port) if nproc > 1 else dict(os.environ)
        env["WANDB_MODE"] = "disabled"
        # glibc returns freed blocks over 128 KiB to the system at once (its default threshold grows to 32 MiB and
        # keeps freed chunks resident): resident memory then follows the live tensors, as a GPU allocator's counts do
        env["MALLOC_MMAP_THRESHOLD_"] = "131072"
        procs.append(subprocess.Popen([sys.executable, __file__, "--measure", json.dumps(overrides), str(work / "run"),
                                       str(work / f"rank{rank}.json")], env=env, cwd=REPO,
                                      stdout=subprocess.DEVNULL, stderr=open(work / f"rank{rank}.log", "w")))
    if any(proc.wait() for proc in procs):
        raise RuntimeError(f"row {row} failed:\n" + "\n".join(
            f"--- rank {rank} ---\n" + (work / f"rank{rank}.log").read_text()[-3000:] for rank in range(nproc)))
    ranks = [json.loads((work / f"rank{rank}.json").read_text()) for rank in range(nproc)]
    measured = max(r["peak"] - r["baseline"] for r in ranks)
    return {"row": row, "overrides": overrides, "measured": measured, "ranks": ranks,
            "seconds": time.perf_counter() - start}


def planned(result: dict) -> int:
    """The plan's total for a row's config, processes and met prompt length, by the plan as it is now."""
    from hydra import compose, initialize_config_dir

    from tokenpo import CONF_DIR
    from tokenpo.config import build_config
    from tokenpo.plan import build_plan

    with initialize_config_dir(CONF_DIR, version_base="1.3"):
        cfg = build_config(compose("train", overrides=result["overrides"]))
    return build_plan(cfg, result["row"][3], None, result["ranks"][0]["prompt_tokens"], device="cpu").total_bytes


def table(results: list[dict]) -> str:
    lines = ["| model | ZeRO | processes | max_new_tokens | act. ckpt | other | prompt | plan (MiB) | measured (MiB) "
             "| error |", "|---|---:|---:|---:|---|---|---:|---:|---:|---:|"]
    for r in results:
        label, _, stage, nproc, new_tokens, ckpt, extra = r["row"]
        plan = planned(r)
        error = (plan - r["measured"]) / r["measured"]
        lines.append(f"| {label} | {stage} | {nproc} | {new_tokens} | {'on' if ckpt else 'off'} | "
                     f"{' '.join(extra) or '-'} | {r['ranks'][0]['prompt_tokens']} | {plan / 2**20:.0f} | "
                     f"{r['measured'] / 2**20:.0f} | {100 * error:+.0f} % |")
    return "\n".join(lines)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--measure":
        measure(json.loads(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", help="comma-separated row numbers (default: all)")
    parser.add_argument("--json", type=Path, help="also write every row's measurements and plan here")
    parser.add_argument("--table-from", type=Path, help="print the table of a --json file (plans recomputed)")
    args = parser.parse_args()
    if args.table_from:
        print(table(json.loads(args.table_from.read_text())))
        return
    chosen = [ROWS[int(i)] for i in args.rows.split(",")] if args.rows else ROWS
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, row in enumerate(chosen):
            work = Path(tmp) / str(i)
            work.mkdir()
            results.append(run_row(row, work))
            print(f"row {i}: {results[-1]['seconds']:.0f} s", file=sys.stderr)
            if args.json:  # after every row: a long table survives an interruption
                args.json.write_text(json.dumps(results, indent=1))
    print(table(results))


if __name__ == "__main__":
    main()

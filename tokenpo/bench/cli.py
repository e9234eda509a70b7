"""`python -m tokenpo.bench` / `tokenpo-bench`: median RL step time of tokenpo (and TRL's GRPOTrainer).

    python -m tokenpo.bench                                   # tokenpo, SmolLM2-135M, 8 prompts x 4 x 32 tokens
    python -m tokenpo.bench --vs-trl --group-size 8 --max-new-tokens 128 --beta 0
    python -m tokenpo.bench --model tiny --steps 2 --override rollout.share_prefill=false
    python -m tokenpo.bench --vs-trl --lora-ranks 0 1 8 64     # full fine-tuning against LoRA ranks: memory, speed
    .venv-vllm/bin/python -m tokenpo.bench --engine vllm --group-size 8 --max-new-tokens 128 --beta 0

Each framework runs in its own subprocess (tokenpo, TRL, tokenpo, TRL, ... for --rounds), so peak memory is
per framework; the first step of every run is warm-up and is not counted.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tokenpo.bench.micro import matmul_gflops
from tokenpo.bench.settings import BenchSettings, train_config
from tokenpo.bench.stats import PHASES, summarise
from tokenpo.errors import ConfigError
from tokenpo.plan.memory import build_plan
from tokenpo.progress import quiet_library_bars


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    d = BenchSettings()
    p = argparse.ArgumentParser(prog="python -m tokenpo.bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=d.model, help="smollm2_135m (the embedded default) or tiny (tests)")
    p.add_argument("--prompts", type=int, default=d.prompts, help="prompts per step")
    p.add_argument("--group-size", type=int, default=d.group_size, help="completions per prompt G")
    p.add_argument("--max-new-tokens", type=int, default=d.max_new_tokens, help="completion length cap")
    p.add_argument("--beta", type=float, default=d.beta, help="KL coefficient (0: no reference model)")
    p.add_argument("--lr", type=float, default=d.lr, help="AdamW learning rate")
    p.add_argument("--micro-batch-size", type=int, default=d.micro_batch_size,
                   help="sequences per forward/backward pass, both frameworks (a multiple of G)")
    p.add_argument("--steps", type=int, default=d.steps, help="steps per run, the first one is warm-up")
    p.add_argument("--threads", type=int, default=d.threads, help="torch intra-op threads per process")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--engine", default=d.engine, help="tokenpo's rollout engine: hf or vllm (scripts/setup_vllm.sh)")
    p.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                   help="extra tokenpo Hydra override (repeatable), e.g. rollout.share_prefill=false")
    p.add_argument("--vs-trl", action="store_true", help="also run TRL's GRPOTrainer at the same settings")
    p.add_argument("--rounds", type=int, default=1, help="runs per framework, alternating tokenpo and TRL")
    p.add_argument("--lora-ranks", type=int, nargs="+", default=None, metavar="R",
                   help="measure each rank in one run, as the override model.lora.rank=R (0: full fine-tuning; "
                        "TRL gets the same PEFT config): step time, peak memory and the memory plan per rank")
    p.add_argument("--out", type=Path, default=None, help="result JSON (default: outputs/bench/<settings>.json)")
    return p.parse_args(argv)


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def run_worker(framework: str, settings: BenchSettings) -> dict:
    """One timed run of `framework` in a fresh process (its own peak memory, its own thread pool)."""
    env = {**os.environ, "OMP_NUM_THREADS": str(settings.threads), "MKL_NUM_THREADS": str(settings.threads)}
    with tempfile.TemporaryDirectory(prefix="tokenpo-bench-") as tmp:
        out = Path(tmp) / "run.json"
        cmd = [sys.executable, "-m", "tokenpo.bench.worker", "--framework", framework,
               "--settings", json.dumps(settings.to_dict()), "--out", str(out)]
        start = time.perf_counter()
        done = subprocess.run(cmd, env=env)
        if done.returncode != 0 or not out.is_file():
            raise RuntimeError(f"the {framework} benchmark run failed (exit {done.returncode}); its output is above")
        result = json.loads(out.read_text())
    result["wall_s"] = time.perf_counter() - start
    return result


LORA_RANK_KEY = "model.lora.rank"
# the memory plan's parts that hold model state (tokenpo.plan.parts): what LoRA changes
STATE_PARTS = ("policy weights", "gradients", "optimizer states", "fp32 master weights", "KL reference")


def lora_variants(settings: BenchSettings, ranks: list[int] | None) -> list[BenchSettings]:
    """The settings themselves, or one copy per LoRA rank (model.lora.rank=R appended to the overrides)."""
    if ranks is None:
        return [settings]
    if any(o.split("=", 1)[0].lstrip("+") == LORA_RANK_KEY for o in settings.overrides):
        raise ConfigError(f"bench --lora-ranks sets {LORA_RANK_KEY} itself; drop --override {LORA_RANK_KEY}=...")
    return [dataclasses.replace(settings, overrides=(*settings.overrides, f"{LORA_RANK_KEY}={rank}"))
            for rank in ranks]


def state_plan(cfg) -> dict:
    """What tokenpo.plan expects this run to hold, in MB: the model state (weights, gradients, AdamW, reference)
    and the whole per-process peak."""
    plan = build_plan(cfg, world=1, suggest=False)
    return {"state_mb": sum(p.bytes for p in plan.parts if p.name in STATE_PARTS) / 2**20,
            "total_mb": plan.total_bytes / 2**20, "trainable_params": plan.trainable_params}


def measure(runs: dict[str, list[dict]]) -> dict:
    report = {framework: {**summarise(framework_runs, framework_runs[0]["shape"]), "runs": framework_runs}
              for framework, framework_runs in runs.items()}
    if "trl" in report:
        report["tokenpo_over_trl"] = report["tokenpo"]["median_step_s"] / report["trl"]["median_step_s"]
    return report


def benchmark(settings: BenchSettings, vs_trl: bool, rounds: int, lora_ranks: list[int] | None = None) -> dict:
    variants = lora_variants(settings, lora_ranks)
    configs = []
    for variant in variants:
        variant.validate()
        configs.append(train_config(variant)[0])  # a bad override fails here, in one line, before any run starts
    if rounds < 1:
        raise ConfigError(f"bench --rounds must be >= 1, got {rounds}")
    frameworks = ("tokenpo", "trl") if vs_trl else ("tokenpo",)
    runs: list[dict[str, list[dict]]] = [{f: [] for f in frameworks} for _ in variants]
    load_start = os.getloadavg()
    for _ in range(rounds):
        for variant, variant_runs in zip(variants, runs):
            for framework in frameworks:
                variant_runs[framework].append(run_worker(framework, variant))
    report = {
        "settings": settings.to_dict(),
        "machine": {"cpu": cpu_model(), "cpus": os.cpu_count(), "load_avg_start": list(load_start),
                    "load_avg_end": list(os.getloadavg()),
                    "matmul_gflops_per_s": matmul_gflops(settings.threads)},
    }
    if lora_ranks is None:
        return {**report, **measure(runs[0])}
    report["lora_ranks"] = [{"rank": rank, "plan": state_plan(cfg), **measure(variant_runs)}
                            for rank, cfg, variant_runs in zip(lora_ranks, configs, runs)]
    return report


def default_out(s: BenchSettings, vs_trl: bool, lora_ranks: list[int] | None = None) -> Path:
    name = (f"{s.model}_{s.engine}_{s.prompts}x{s.group_size}x{s.max_new_tokens}_beta{s.beta:g}"
            f"{'_lora' + '-'.join(map(str, lora_ranks)) if lora_ranks else ''}{'_vs_trl' if vs_trl else ''}")
    return Path("outputs") / "bench" / f"{time.strftime('%Y-%m-%d_%H-%M-%S')}_{name}.json"


def table(report: dict) -> str:
    frameworks = [f for f in ("tokenpo", "trl") if f in report]
    rows = [("median step", "median_step_s")] + [(p, p) for p in PHASES]
    lines = ["phase (s, median)".ljust(20) + "".join(f.rjust(10) for f in frameworks)]
    for label, key in rows:
        values = [report[f]["median_step_s"] if key == "median_step_s" else report[f]["phases_s"][key]
                  for f in frameworks]
        lines.append(label.ljust(20) + "".join(f"{v:10.2f}" for v in values))
    lines.append("step CPU s (median)".ljust(20) + "".join(f"{report[f]['median_step_cpu_s']:10.2f}" for f in frameworks))
    lines.append("peak RSS (MB)".ljust(20) + "".join(f"{report[f]['peak_rss_mb']:10.0f}" for f in frameworks))
    lines.append("  training process".ljust(20) + "".join(f"{report[f]['peak_rss_process_mb']:10.0f}"
                                                     for f in frameworks))
    lines.append("completion tok/s".ljust(20) + "".join(f"{report[f]['completion_tokens_per_s']:10.1f}"
                                                       for f in frameworks))
    lines.append("generation tok/s".ljust(20) + "".join(f"{report[f]['generation_tokens_per_s'] or 0:10.1f}"
                                                       for f in frameworks))
    for phase in sorted({p for f in frameworks for p in report[f].get("ahead_s", {})}):
        lines.append(f"{phase} (s)".ljust(20) + "".join(f"{report[f].get('ahead_s', {}).get(phase, 0):10.2f}"
                                                       for f in frameworks))
    lines.append("weight sync % step".ljust(20) + "".join(f"{100 * report[f]['weight_sync_frac']:10.1f}"
                                                         for f in frameworks))
    if "tokenpo_over_trl" in report:
        lines.append(f"tokenpo / TRL median step: {report['tokenpo_over_trl']:.3f}")
    return "\n".join(lines)


def lora_table(report: dict) -> str:
    """Per rank: median step (wall and CPU seconds), peak RSS of the training process, and its saving against
    full fine-tuning (rank 0 in the list) next to the saving the memory plan's model state predicts."""
    rows = report["lora_ranks"]
    full = next((row for row in rows if row["rank"] == 0), None)
    frameworks = [f for f in ("tokenpo", "trl") if f in rows[0]]
    header = ["rank", "trainable", "plan state MB"]
    for f in frameworks:
        header += [f"{f} step s", f"{f} CPU s", f"{f} peak RSS MB", f"{f} saved MB"]
    header.append("plan saved MB")
    lines = [" | ".join(header)]
    for row in rows:
        trainable = row["tokenpo"]["runs"][0]["shape"]["trainable_params"]
        cells = ["full" if row["rank"] == 0 else str(row["rank"]), f"{trainable:,}",
                 f"{row['plan']['state_mb']:.0f}"]
        for f in frameworks:
            rss = row[f]["peak_rss_process_mb"]
            saved = "" if full is None else f"{full[f]['peak_rss_process_mb'] - rss:.0f}"
            cells += [f"{row[f]['median_step_s']:.2f}", f"{row[f]['median_step_cpu_s']:.2f}", f"{rss:.0f}", saved]
        cells.append("" if full is None else f"{full['plan']['state_mb'] - row['plan']['state_mb']:.0f}")
        lines.append(" | ".join(cells))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    quiet_library_bars()  # and the workers', which inherit its switches
    args = parse_args(argv)
    settings = BenchSettings(model=args.model, prompts=args.prompts, group_size=args.group_size,
                             max_new_tokens=args.max_new_tokens, beta=args.beta, lr=args.lr,
                             micro_batch_size=args.micro_batch_size, steps=args.steps,
                             threads=args.threads, seed=args.seed, engine=args.engine,
                             overrides=tuple(args.override))
    try:
        report = benchmark(settings, args.vs_trl, args.rounds, args.lora_ranks)
    except (ConfigError, RuntimeError) as err:
        print(f"tokenpo-bench: error: {err}", file=sys.stderr)
        sys.exit(2)
    out = args.out or default_out(settings, args.vs_trl, args.lora_ranks)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1))
    print(lora_table(report) if args.lora_ranks else table(report))
    print(f"written: {out}")

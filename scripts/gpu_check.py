"""The GPU check (run by scripts/check_gpu.sh after its offline install): its parts in order of value, each a
subprocess under its own timeout, all inside one wall-clock budget. Into --out, as each part finishes: <part>.log
(written as it runs, and the log of each tokenpo run beside it), <part>.json (its row) and gpu_check.md (the table
of all parts, rewritten after each), so a run stopped at any point returns what it did.

    python scripts/gpu_check.py --out "$OUT"                        # on the GPU machine (check_gpu.sh does this)
    python scripts/gpu_check.py --device cpu --out /tmp/gpu_check   # the same parts at small sizes: gloo, fp32
    python scripts/gpu_check.py --device cpu --only device dtypes   # some parts

The parts and their budget: docs/memory.md, "The GPU check".
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "gpu_check"))

from harness import Part, python_part, run_check  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
PARTS_SCRIPT = REPO / "scripts" / "gpu_check" / "parts.py"
# (part, what it checks, its timeout in seconds on the H200: about twice the estimate in docs/memory.md; sum 440)
PLAN = (
    ("device", "CUDA device, NCCL process group (all-reduce), tokenpo's own set-up: tiny model, 1 step", 45),
    ("zero3_lora_resume", "bf16 ZeRO-3 + LoRA r16 + gradient checkpointing + recompute_head, ~0.4B; save, resume", 90),
    ("zero3_two_ranks", "ZeRO-3 on 2 processes, unequal lengths, 16-token head chunks; metrics equal ZeRO-2's", 60),
    ("vocab152k_2k", "152064-row output layer, 2048-token responses, recompute_head, ZeRO 2, bf16", 70),
    ("dapo_dynamic_sampling", "DAPO with dynamic sampling (rounds, dropped groups), ~0.4B, ZeRO 2, bf16", 45),
    ("dtypes", "model.dtype x deepspeed.precision: kl/ref exactly 0 at step 1; refused pairs in one line", 50),
    ("memory_phases", "hf engine, ZeRO 0, worst case first: order of empty_cache calls and reserved memory", 40),
    ("logprobs", "sampler (incremental decode) vs trainer log-probs of sampled tokens, bf16, ~0.4B", 25),
    ("peak_vs_plan", "CUDA peak reserved of each run above against tokenpo.plan", 15),
)
# the CPU rehearsal's timeouts: 2 shared cores, tiny sizes
CPU_TIMEOUT_S = {"zero3_lora_resume": 240, "zero3_two_ranks": 300, "dtypes": 180}


def parts_for(device: str, out: Path, work: Path, only: list[str] | None) -> list[Part]:
    return [python_part(name, what, CPU_TIMEOUT_S.get(name, 120) if device == "cpu" else timeout_s, PARTS_SCRIPT,
                        name, "--device", device, "--out", str(out), "--work", str(work))
            for name, what, timeout_s in PLAN if not only or name in only]


def header(device: str, budget_s: float) -> str:
    where = "CPU rehearsal (gloo, fp32, tiny sizes): a check of the harness, not of a GPU" if device == "cpu" else (
        "one CUDA device, bf16 with NCCL, one process per run")
    return (f"# GPU check (scripts/check_gpu.sh)\n\n{where}; budget {budget_s:.0f} s, each part under its own "
            "timeout. Each part's log and findings: <part>.log and <part>.json beside this table; the device: the "
            "device row's <part>.json.\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "outputs" / "check_gpu")
    # the drawn models (0.7 GB) and the run dirs with their checkpoints stay out of --out (it comes back from the slot)
    parser.add_argument("--work", type=Path, default=Path("/tmp/tokenpo_gpu_check"), help="models and run dirs")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--budget", type=float, default=440, help="seconds for all parts together")
    parser.add_argument("--only", nargs="+", choices=[name for name, _, _ in PLAN], help="run these parts only")
    args = parser.parse_args()
    out = args.out.resolve()
    parts = parts_for(args.device, out, args.work.resolve(), args.only)
    rows = run_check(parts, out, args.budget, header(args.device, args.budget), REPO)
    print((out / "gpu_check.md").read_text())
    sys.exit(0 if all(row.status == "ok" for row in rows) else 1)


if __name__ == "__main__":
    main()

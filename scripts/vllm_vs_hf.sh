#!/usr/bin/env bash
# The embedded default (GRPO, SmolLM2-135M-Instruct, built-in arithmetic) trained for a few steps with each rollout
# engine, same seed and settings: held-out greedy accuracy before -> after, and the median step time. Prints a
# markdown table (docs/rollout.md has one). Extra arguments are Hydra overrides for both runs.
#   bash scripts/vllm_vs_hf.sh                      # 10 steps
#   STEPS=30 bash scripts/vllm_vs_hf.sh trainer.threads=2
set -euo pipefail
cd "$(dirname "$0")/.."
PY="$(bash scripts/setup_vllm.sh | tail -n 1)"
STEPS="${STEPS:-10}"
OUT="outputs/vllm_vs_hf/$(date +%Y-%m-%d_%H-%M-%S)"
for engine in hf vllm; do
  WANDB_MODE=disabled "$PY" -m tokenpo.train "rollout=$engine" "trainer.max_steps=$STEPS" logger.mode=disabled \
    trainer.resume=none "hydra.run.dir=$OUT/$engine" "$@"
done
"$PY" - "$OUT" <<'PY'
import json, statistics, sys
from pathlib import Path

out = Path(sys.argv[1])
print(f"| engine | held-out accuracy before | after | median step (s) | steps |  ({out})")
print("|---|---:|---:|---:|---:|")
for engine in ("hf", "vllm"):
    summary = json.loads((out / engine / "summary.json").read_text())
    steps = [json.loads(line) for line in (out / engine / "metrics.jsonl").read_text().splitlines()]
    step_s = statistics.median(r["timing/step_s"] for r in steps if "timing/step_s" in r)
    print(f"| {engine} | {summary['eval_before']:.3f} | {summary['eval_after']:.3f} | {step_s:.1f} | {summary['steps']} |")
PY

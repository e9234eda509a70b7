#!/usr/bin/env bash
# rollout=vllm_server against the colocated vllm engine and the hf engine on the same work (docs/performance.md,
# "vLLM servers on this machine"): the embedded default (SmolLM2-135M-Instruct fp32, 8 prompts x 4 responses of <= 32
# tokens) for STEPS steps each, in the environment of scripts/setup_vllm.sh. The server runs on core 1 and the
# trainer on core 0 (1 + 1); the colocated engines generate and train in turn on both cores (vllm_k1: one step ahead
# in its generator process beside a one-thread trainer). Then one line per run:
# median step, generated tokens per second of step, the trainer's wait for rollouts, the weight push (seconds, MiB,
# seconds per MiB) and the sampler-trainer gap (mean |Δ log p| on the sampled tokens), steps 2..STEPS.
#   STEPS (6), OUT (outputs/bench_vllm_server)
set -euo pipefail
cd "$(dirname "$0")/.."
PY="$(bash scripts/setup_vllm.sh | tail -n 1)"
STEPS="${STEPS:-6}"
OUT="${OUT:-outputs/bench_vllm_server}"
COMMON=(logger.mode=disabled trainer.print_samples=0 eval.before_training=false eval.every_steps=0 eval.max_problems=8
        "trainer.max_steps=$STEPS")
run() {  # NAME CPUS OVERRIDES...
  local name=$1 cpus=$2
  shift 2
  [ -f "$OUT/$name/summary.json" ] || WANDB_MODE=disabled HF_HUB_OFFLINE=1 taskset -c "$cpus" "$PY" -m tokenpo.train \
      "${COMMON[@]}" "$@" "hydra.run.dir=$OUT/$name" > "$OUT/$name.log" 2>&1
}
mkdir -p "$OUT"
run hf 0-1 rollout=hf trainer.threads=2
run vllm 0-1 rollout=vllm trainer.threads=2
# colocated vLLM one step ahead: its generator process beside a one-thread trainer
run vllm_k1 0-1 rollout=vllm rollout.async.max_staleness=1 trainer.threads=1 rollout.async.generator_threads=1
# the trainer on core 0; the server tokenpo starts binds its threads to core 1 (it is started outside taskset's mask
# by its own VLLM_CPU_OMP_THREADS_BIND)
run server_k0 0-1 rollout=vllm_server rollout.server.cpu_cores=1 trainer.threads=1
run server_k1 0-1 rollout=vllm_server rollout.server.cpu_cores=1 trainer.threads=1 rollout.async.max_staleness=1
"$PY" - "$OUT" <<'PYEOF'
import json, statistics, sys
from pathlib import Path
out = Path(sys.argv[1])
print(f"{'run':<10} {'s/step':>7} {'tok/s':>7} {'wait rollouts s':>15} {'push s':>7} {'push MiB':>8} {'ms/MiB':>7} {'|dlogp|':>8}")
for name in ("hf", "vllm", "vllm_k1", "server_k0", "server_k1"):
    rows = [json.loads(line) for line in (out / name / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if r.get("step", 0) >= 2]
    med = lambda key: statistics.median(r[key] for r in rows if key in r) if any(key in r for r in rows) else float("nan")
    step = med("timing/step_s")
    tokens = statistics.median(r["tokens/generated"] / r["timing/step_s"] for r in rows)
    push, mib = med("timing/weight_push_s"), med("rollout/weight_push_mib")
    print(f"{name:<10} {step:7.2f} {tokens:7.1f} {med('timing/trainer_wait_rollouts_s'):15.2f} {push:7.2f} {mib:8.1f} "
          f"{1000 * push / mib if mib == mib else float('nan'):7.2f} {med('mismatch/abs_logp_diff'):8.2e}")
PYEOF

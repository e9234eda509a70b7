#!/usr/bin/env bash
# Multi-process checks: the 2-process tests (ZeRO 0-3 against a one-process reference, exact resume, launching),
# then the tiny model for 2 steps under ZeRO-3 through each launcher with NPROC processes (default 2; on GPUs one
# per GPU, NCCL). Each run must end with exit status 0 and one run dir under $OUT.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="$(bash scripts/setup.sh | tail -n 1)"
NPROC="${NPROC:-2}"
OUT="${CHECK_DIR:-outputs/check_distributed}"
TINY=(model=tiny deepspeed=zero3 trainer.max_steps=2 logger.mode=disabled data.prompts_per_step=$((2 * NPROC))
      rollout.group_size=2 rollout.max_new_tokens=8 eval.max_problems=4)
rm -rf "$OUT"
"$PY" -m pytest -q -m multiproc tests/trainer tests/deepspeed
"$PY" -m tokenpo.train "${TINY[@]}" trainer.nproc="$NPROC" hydra.run.dir="$OUT/nproc"
"$PY" -m torch.distributed.run --standalone --nproc_per_node "$NPROC" -m tokenpo.train "${TINY[@]}" \
    hydra.run.dir="$OUT/torchrun"
"$(dirname "$PY")/deepspeed" --num_gpus "$NPROC" --master_port "$((29500 + RANDOM % 1000))" --module tokenpo.train \
    "${TINY[@]}" hydra.run.dir="$OUT/deepspeed"
for run in nproc torchrun deepspeed; do
  test "$(grep -c '"step"' "$OUT/$run/metrics.jsonl")" -eq 3 || { echo "$run: expected steps 0-2 once each"; exit 1; }
  test -f "$OUT/$run/final/config.json" || { echo "$run: no exported policy"; exit 1; }
done
echo "distributed checks passed: $OUT"

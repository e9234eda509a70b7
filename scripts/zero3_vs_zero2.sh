#!/usr/bin/env bash
# ZeRO-3 on 2 processes trains what ZeRO-2 trains: the same 2-step run at both stages, ranks of unequal response
# lengths and a 2-token output-layer chunk (so every pass runs the output layer in several chunks, a different number
# on each rank without lockstep), metrics compared within a relative 1e-5 (scripts/compare_metrics.py).
#   bash scripts/zero3_vs_zero2.sh [extra overrides ...]
# e.g. `trainer.micro_batch_tokens=64`, `trainer.pack_sequences=true trainer.micro_batch_tokens=64`,
# `trainer.recompute_head=true`, `model.lora.rank=8`. NPROC=1 runs one process; RTOL / ATOL set the tolerances
# (1e-5 relative, 0 absolute by default). Exit status 0 when they agree. tests/deepspeed/
# test_zero3_vs_zero2.py (marked slow) runs it for each of those.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
OUT="$(mktemp -d)"
trap 'rm -rf "$OUT"' EXIT
COMMON=(model=tiny "trainer.nproc=${NPROC:-2}" trainer.logit_chunk_tokens=2 rollout.max_new_tokens=24 trainer.max_steps=2
        trainer.dist_timeout_s=120 logger.mode=disabled eval.every_steps=0 eval.before_training=false "$@")
# BASELINE=zero1 (or zero0) compares two stages that both keep whole parameters: how far reduction order alone moves
# the metrics
for stage in "${BASELINE:-zero2}" "${STAGE:-zero3}"; do
  "$PY" -m tokenpo.train "${COMMON[@]}" "deepspeed=$stage" "hydra.run.dir=$OUT/$stage" > "$OUT/$stage.log" 2>&1 ||
    { tail -n 30 "$OUT/$stage.log"; echo "tokenpo: $stage run failed" >&2; exit 1; }
done
"$PY" scripts/compare_metrics.py "$OUT/${BASELINE:-zero2}" "$OUT/${STAGE:-zero3}" --rtol "${RTOL:-1e-5}" --atol "${ATOL:-0}"

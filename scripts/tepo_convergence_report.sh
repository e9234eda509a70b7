#!/usr/bin/env bash
# The TEPO convergence study's comparisons (docs/results.md, "Does TEPO converge in half the time?") from its runs'
# files: the curve fits of held-out accuracy and of training accuracy (ScaleRL's Eq. 1) against generated tokens and
# against wall time, against GRPO, against DAPO, and the two ablations against TEPO. Recomputes every figure of the
# section from the committed runs: bash scripts/tepo_convergence_report.sh (a few minutes; the seed resampling
# refits each group 200 times).
#   RUNS (docs/data/tepo_convergence/runs: each run's metrics.jsonl, .hydra/overrides.yaml, environment.json)
#   OUT (docs/data/tepo_convergence: where the comparisons go)
set -euo pipefail
cd "$(dirname "$0")/.."
PY="$(bash scripts/setup.sh | tail -n 1)"
RUNS="${1:-docs/data/tepo_convergence/runs}"
OUT="${2:-docs/data/tepo_convergence}"
FIT=(--target-metric eval/accuracy --target 0.5 --band ci --fit-curves --fit-metric eval/accuracy
     --fit-metric accuracy/drawn)
"$PY" -m tokenpo.compare "$RUNS" --baseline algorithm=grpo "${FIT[@]}" --compute tokens --out "$OUT"
"$PY" -m tokenpo.compare "$RUNS" --baseline algorithm=grpo "${FIT[@]}" --compute time --no-figures \
    --out "$OUT/time"
"$PY" -m tokenpo.compare "$RUNS" --baseline algorithm=dapo "${FIT[@]}" --compute tokens --no-figures \
    --out "$OUT/vs_dapo"
"$PY" -m tokenpo.compare "$RUNS" --baseline algorithm=dapo "${FIT[@]}" --compute time --no-figures \
    --out "$OUT/vs_dapo/time"
"$PY" -m tokenpo.compare "$RUNS" --baseline algorithm=tepo "${FIT[@]}" --compute tokens --no-figures \
    --out "$OUT/vs_tepo"

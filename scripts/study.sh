#!/usr/bin/env bash
# CPU-scale study on the embedded default: all seven algorithms x 3 seeds on the shared testbed
# (scripts/lib/testbed.sh), then the comparison (figures + table into docs/study/). Wall time on 2 cores:
# see docs/results.md. Extra arguments are Hydra overrides for every run.
#   STUDY_STEPS (default 6) training steps per run; STUDY_DIR (default outputs/study) the multirun folder.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="$(bash scripts/setup.sh | tail -n 1)"
source scripts/lib/testbed.sh
OUT="${STUDY_DIR:-outputs/study}"
timed_sweep study "$OUT" "${STUDY_STEPS:-6}" algorithm=grpo,dapo,tepo,gtpo,grpo_s,dr_grpo,gspo seed=0,1,2 "$@"
"$PY" -m tokenpo.compare "$OUT" --baseline algorithm=grpo --target-metric eval/accuracy --target 0.7 \
    --band minmax --out docs/study

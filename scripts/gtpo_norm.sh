#!/usr/bin/env bash
# GTPO's advantage normalisation (Eq. 6) read three ways, on the embedded default with the same seeds and
# steps: joint, per_polarity, scale_only, on the shared testbed (scripts/lib/testbed.sh). The default in
# conf/algorithm/gtpo.yaml was chosen from this. Extra arguments are Hydra overrides for every run.
#   GTPO_NORM_STEPS (default 4) training steps per run; GTPO_NORM_DIR (default outputs/gtpo_norm) the multirun
#   folder.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="$(bash scripts/setup.sh | tail -n 1)"
source scripts/lib/testbed.sh
OUT="${GTPO_NORM_DIR:-outputs/gtpo_norm}"
timed_sweep "gtpo norm" "$OUT" "${GTPO_NORM_STEPS:-4}" \
    algorithm=gtpo algorithm.advantage.norm=joint,per_polarity,scale_only seed=0,1 "$@"
"$PY" -m tokenpo.compare "$OUT" --group-by algorithm.advantage.norm --target-metric eval/accuracy --target 0.7 \
    --band minmax --out docs/data/gtpo_norm

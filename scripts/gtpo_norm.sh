#!/usr/bin/env bash
# GTPO's advantage normalisation (Eq. 6) read three ways, on the embedded default with the same seeds and
# steps: joint, per_polarity, scale_only. The default in conf/algorithm/gtpo.yaml was chosen from this.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="$(bash scripts/setup.sh | tail -n 1)"
OUT="${GTPO_NORM_DIR:-outputs/gtpo_norm}"
STEPS="${GTPO_NORM_STEPS:-4}"
start=$(date +%s)
"$PY" -m tokenpo.train -m algorithm=gtpo algorithm.advantage.norm=joint,per_polarity,scale_only seed=0,1 \
    trainer.max_steps="$STEPS" trainer.mini_batches=2 algorithm.dynamic_sampling.max_gen_batches=2 eval.every_steps=2 trainer.print_samples=0 logger.mode=disabled \
    hydra.sweep.dir="$OUT" "$@"
echo "gtpo norm wall time: $(( $(date +%s) - start )) s"
"$PY" -m tokenpo.compare "$OUT" --group-by algorithm.advantage.norm --target-metric eval/accuracy --target 0.7 \
    --band minmax --out docs/gtpo_norm

#!/usr/bin/env bash
# CPU-scale study on the embedded default: all seven algorithms x 3 seeds, then the comparison
# (figures + table into docs/study/). Wall time on 2 cores: see docs/results.md. Two policy updates per
# rollout (trainer.mini_batches=2) so ratios, clipping and the TEPO mask act; at most 2 generation rounds
# for dynamic sampling to bound the CPU time.
#   STUDY_STEPS (default 6) training steps per run; STUDY_DIR (default outputs/study) the multirun folder.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="$(bash scripts/setup.sh | tail -n 1)"
OUT="${STUDY_DIR:-outputs/study}"
STEPS="${STUDY_STEPS:-6}"
start=$(date +%s)
"$PY" -m tokenpo.train -m algorithm=grpo,dapo,tepo,gtpo,grpo_s,dr_grpo,gspo seed=0,1,2 \
    trainer.max_steps="$STEPS" trainer.mini_batches=2 algorithm.dynamic_sampling.max_gen_batches=2 eval.every_steps=2 trainer.print_samples=0 logger.mode=disabled \
    hydra.sweep.dir="$OUT" "$@"
echo "study wall time: $(( $(date +%s) - start )) s"
"$PY" -m tokenpo.compare "$OUT" --baseline algorithm=grpo --target-metric eval/accuracy --target 0.7 \
    --band minmax --out docs/study

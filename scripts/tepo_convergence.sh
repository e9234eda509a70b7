#!/usr/bin/env bash
# The TEPO convergence study (docs/results.md, "Does TEPO converge in half the time?"; its design was written in
# docs/records/results.md before the runs): GRPO, DAPO, TEPO and two TEPO ablations (its token-level KL mask off:
# experiment=tepo/mask_off; its sequence-likelihood ratio replaced by GRPO's per-token ratio:
# experiment=tepo/ratio_token), 8 seeds x 10 steps each on the study testbed (scripts/study.sh), held-out greedy
# accuracy on 64 problems before training and after every step (11 points a run for the curve fits), training
# accuracy as the free second signal; then each run's files into docs/data/tepo_convergence/runs/ and the curve fits
# (scripts/tepo_convergence_report.sh) into docs/data/tepo_convergence/.
# Sized to about 2 h on the 2-core machine: 40 runs of ~5.5 min, two side by side (STUDY_JOBS=2: each group's 8
# seeds in 4 pairs), measured on a pilot run (one step ~14.5 s, one evaluation of 64 problems ~14 s at one thread).
# Rerunning resumes: finished runs are skipped (scripts/study.sh). Environment and extra arguments as
# scripts/study.sh (STUDY_DIR default outputs/tepo_convergence).
set -euo pipefail
cd "$(dirname "$0")/.."
export STUDY_DIR="${STUDY_DIR:-outputs/tepo_convergence}" STUDY_DOCS="${STUDY_DOCS:-docs/data/tepo_convergence}"
export STUDY_STEPS="${STUDY_STEPS:-10}" STUDY_SEEDS="${STUDY_SEEDS:-0 1 2 3 4 5 6 7}" STUDY_LANES=1 STUDY_JOBS=2
export STUDY_TRANSFER=0 STUDY_FIT="--fit-curves --compute tokens --fit-metric eval/accuracy --fit-metric accuracy/drawn"
export STUDY_GROUPS="${STUDY_GROUPS:-algorithm=grpo algorithm=dapo algorithm=tepo experiment=tepo/mask_off \
experiment=tepo/ratio_token}"
status=0
bash scripts/study.sh eval.every_steps=1 eval.before_training=true 'eval.extra=[]' data.arith.eval_size=64 \
    eval.max_problems=64 eval.batch_size=64 "$@" || status=$?
# each run's files behind the figures (its metrics, overrides and numerics environment; no weights, no paths)
RUNS="$STUDY_DOCS/runs"
for run in "$STUDY_DIR"/*/seed*; do
  [ -f "$run/summary.json" ] || continue
  keep="$RUNS/${run#"$STUDY_DIR"/}"
  mkdir -p "$keep/.hydra"
  cp "$run/metrics.jsonl" "$run/environment.json" "$keep/"
  cp "$run/.hydra/overrides.yaml" "$keep/.hydra/"
done
# every comparison again from those files (the first one rewrites study.sh's, from the same runs)
bash scripts/tepo_convergence_report.sh "$RUNS" "$STUDY_DOCS"
exit "$status"

#!/usr/bin/env bash
# The entropy-methods study (docs/results.md, "Entropy methods"): the eight 2025 entropy-control and trust-region
# baselines of conf/experiment/entropy/ beside GRPO, DAPO, TEPO and GTPO, 5 seeds x 12 steps each on the study
# testbed (scripts/study.sh: data=arith_study, two updates per rollout, one thread per run, two lanes), held-out
# accuracy (200 problems) before training and every 3 steps for the curve fits, the transfer set after the last step;
# then the comparisons against GRPO (with the ScaleRL curve fits against generated tokens) into docs/entropy_study/
# and against DAPO into docs/entropy_study/vs_dapo/. Sized to about 3 hours on the 2-core machine (60 runs of ~6 min
# at two lanes). Environment and extra arguments as scripts/study.sh (STUDY_DIR default outputs/entropy_study).
set -euo pipefail
cd "$(dirname "$0")/.."
export STUDY_DIR="${STUDY_DIR:-outputs/entropy_study}" STUDY_DOCS="${STUDY_DOCS:-docs/entropy_study}"
export STUDY_STEPS="${STUDY_STEPS:-12}" STUDY_FIT="--fit-curves --compute tokens"
# DAPO-based groups (dynamic sampling: more generation) alternate between the two lanes (study.sh: lane l runs
# every second group from the l-th)
export STUDY_GROUPS="${STUDY_GROUPS:-algorithm=dapo experiment=entropy/clip_cov algorithm=grpo experiment=entropy/kl_cov \
experiment=entropy/entropy_top algorithm=tepo algorithm=gtpo experiment=entropy/cispo experiment=entropy/gmpo \
experiment=entropy/sapo experiment=entropy/entropy_advantage experiment=entropy/adaptive_entropy}"
status=0
bash scripts/study.sh eval.every_steps=3 eval.before_training=true "$@" || status=$?
PY="$(bash scripts/setup.sh | tail -n 1)"
"$PY" -m tokenpo.compare "$STUDY_DIR" --baseline algorithm=dapo --target-metric eval/accuracy --target 0.5 --band ci \
    --no-figures --out "$STUDY_DOCS/vs_dapo"
"$PY" -m tokenpo.compare "$STUDY_DIR" --baseline algorithm=dapo --target-metric eval/arith_transfer/accuracy \
    --target 0.3 --band ci --no-figures --out "$STUDY_DOCS/vs_dapo/transfer"
exit "$status"

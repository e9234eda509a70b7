#!/usr/bin/env bash
# The asynchronous-rollout study (docs/results.md, "Generation ahead of the update"): the study testbed
# (scripts/study.sh: data=arith_study, two updates per rollout, 12 steps, held-out accuracy before training and every
# 3 steps, transfer after the last) with generation in turn (experiment=async/in_turn, 2 threads), one version ahead
# with AReaL's decoupled correction (async/decoupled) and without it (async/plain, the control), 1 + 1 threads, 5 seeds
# each, one run at a time (the wall-time axis is the run's own). Equivalence margin, named before the runs: 0.05
# held-out accuracy (10 of the 200 problems). Environment and extra arguments as scripts/study.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
export STUDY_DIR="${STUDY_DIR:-outputs/async_study}" STUDY_DOCS="${STUDY_DOCS:-docs/data/async_study}"
export STUDY_STEPS="${STUDY_STEPS:-12}" STUDY_LANES=1 STUDY_THREADS="" STUDY_MARGIN="${STUDY_MARGIN:-0.05}"
export STUDY_BASELINE=experiment=async/in_turn STUDY_FIT="--fit-curves --compute tokens"
export STUDY_GROUPS="${STUDY_GROUPS:-experiment=async/in_turn experiment=async/decoupled experiment=async/plain}"
exec bash scripts/study.sh eval.every_steps=3 eval.before_training=true "$@"

#!/usr/bin/env bash
# The CPU study (docs/results.md): GRPO, DAPO, GTPO, the GTPO alpha2 = 0 control, GRPO-S, TEPO, Dr. GRPO and GSPO
# with their paper defaults x 5 seeds x 15 steps on the shared testbed (scripts/lib/testbed.sh) with the study's
# data and evaluation (data=arith_study, eval=arith_study: 200 held-out problems and a 200-problem two-digit
# transfer set, both greedy after the last step), then the comparisons (figures, summaries and significance
# tables against GRPO) into docs/data/study/ and docs/data/study/transfer/.
#
# Sized for the 2-core development machine: 4 prompts x 4 responses of at most 24 tokens a step (trained answers
# take 10-16; the main job allows 32); every run at trainer.threads=1, two
# runs side by side (STUDY_LANES), so each run's numbers do not depend on what runs beside it. Each group is one
# Hydra sweep over the seeds into <STUDY_DIR>/<group>/seed<N>, one run at a time; the lanes take every
# STUDY_LANES-th group each, so no lane idles while a group's odd seed runs alone (Hydra's joblib launcher,
# tokenpo[cluster], docs/cluster.md). Rerunning the script resumes an interrupted study the way any sweep resumes:
# finished runs are skipped, a run with a checkpoint continues, the rest start; a new STUDY_DIR runs everything
# again. The untrained model's scores (the same for every run: greedy, same weights) come from one extra run that
# evaluates before its first step, written to <STUDY_DIR>_base/seed0.
#   STUDY_DIR (outputs/study), STUDY_STEPS (15), STUDY_SEEDS ("0 1 2 3 4"), STUDY_GROUPS (one override per group,
#   space-separated; default the eight above; keep algorithm=grpo, the baseline), STUDY_LANES (2), STUDY_DOCS
#   (docs/data/study: where the comparison goes), STUDY_MARGIN (unset: none; an equivalence margin named in advance, passed
#   to tokenpo.compare --margin), STUDY_FIT (unset: none; e.g. "--fit-curves --compute tokens": extra arguments of
#   the held-out comparison), STUDY_THREADS (1; empty: not set, the groups' own), STUDY_BASELINE (algorithm=grpo:
#   the group the comparisons are taken against), STUDY_JOBS (1: the runs of one group's sweep side by side, Hydra's
#   joblib launcher; a group of an even number of seeds keeps two jobs busy where lanes of whole groups would not),
#   STUDY_TRANSFER (1; 0: the runs have no transfer set and its comparison is skipped). Extra arguments are Hydra
#   overrides for every run.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="$(bash scripts/setup.sh | tail -n 1)"
source scripts/lib/testbed.sh
OUT="${STUDY_DIR:-outputs/study}"
STEPS="${STUDY_STEPS:-15}"
LANES="${STUDY_LANES:-2}"
DOCS="${STUDY_DOCS:-docs/data/study}"
MARGIN=(${STUDY_MARGIN:+--margin "$STUDY_MARGIN"})
read -r -a SEEDS <<< "${STUDY_SEEDS:-0 1 2 3 4}"
read -r -a GROUPS_ <<< "${STUDY_GROUPS:-algorithm=grpo algorithm=dapo algorithm=gtpo experiment=gtpo/alpha2_0_control \
algorithm=grpo_s algorithm=tepo algorithm=dr_grpo algorithm=gspo}"
THREADS="${STUDY_THREADS-1}"
BASELINE="${STUDY_BASELINE:-algorithm=grpo}"
JOBS="${STUDY_JOBS:-1}"
COMMON=(data=arith_study eval=arith_study data.prompts_per_step=4 rollout.max_new_tokens=24
        ${THREADS:+trainer.threads=$THREADS} "${TESTBED[@]}" "$@")

# sweep DIR STEPS SEEDS OVERRIDES...: the Hydra sweep over OVERRIDES and the comma-separated SEEDS into
# DIR/seed<N>, one job at a time, STEPS steps each (console output in DIR/sweep.log); prints what became of each run
sweep() {
  local dir=$1 steps=$2 seeds=$3
  shift 3
  mkdir -p "$dir"
  "$PY" -m tokenpo.train -m "$@" seed="$seeds" trainer.max_steps="$steps" "${COMMON[@]}" hydra.sweep.dir="$dir" \
      'hydra.sweep.subdir=seed${seed}' hydra/launcher=joblib hydra.launcher.n_jobs="$JOBS" > "$dir/sweep.log" 2>&1 || true
  rm -rf "$dir"/seed*/final  # the study keeps metrics and eval records, not 41 copies of the 0.5 GB weights
  for seed in ${seeds//,/ }; do
    local run="$dir/seed$seed"
    if "$PY" -c "import json,sys; s=json.load(open(sys.argv[1])); \
sys.exit(0 if s['steps'] == int(sys.argv[2]) and not s['interrupted'] else 1)" "$run/summary.json" "$steps" 2>/dev/null; then
      echo "done: $run ($(date +%H:%M:%S))"
    else
      echo "FAILED: $run (see $run/train.log and $dir/sweep.log)"
      echo "$run" >> "$FAILED"
    fi
  done
}

start=$(date +%s)
FAILED=$(mktemp)  # one line per failed run
# the untrained model's held-out and transfer scores, once
sweep "${OUT}_base" 1 0 algorithm=grpo eval.before_training=true
# lane LANE: every LANES-th group from the LANE-th, one after another
lane() {
  local index
  for (( index = $1; index < ${#GROUPS_[@]}; index += LANES )); do
    local group=${GROUPS_[index]} name
    name=${group#*=}
    sweep "$OUT/${name//\//_}" "$STEPS" "$(IFS=,; echo "${SEEDS[*]}")" "$group"
  done
}
for (( l = 0; l < LANES; l++ )); do lane "$l" & done
wait
failed=$(wc -l < "$FAILED")
echo "study wall time: $(( $(date +%s) - start )) s; failed runs: $failed"

read -r -a FIT <<< "${STUDY_FIT:-}"
"$PY" -m tokenpo.compare "$OUT" --baseline "$BASELINE" --target-metric eval/accuracy --target 0.5 --band ci \
    "${MARGIN[@]}" "${FIT[@]}" --out "$DOCS"
if [[ "${STUDY_TRANSFER:-1}" != 0 ]]; then
  "$PY" -m tokenpo.compare "$OUT" --baseline "$BASELINE" --target-metric eval/arith_transfer/accuracy \
      --target 0.3 --band ci --no-figures "${MARGIN[@]}" --out "$DOCS/transfer"
fi
exit $(( failed > 0 ))

#!/usr/bin/env bash
# Sweep checks with the real Hydra plugins (tokenpo[cluster]) on the tiny model, printing what docs/cluster.md reports:
#   1. a submitit_local job of 2 tasks against a trainer.nproc=2 run: identical metrics (the keys compared listed);
#   2. a 2 x 2 sweep (algorithm=grpo,dapo x seed=0,1) run one job after another and with hydra/launcher=joblib,
#      2 jobs side by side at 1 thread each: identical metrics, and the wall time of each;
#   3. the same 4-job sweep killed (SIGKILL, the whole process group) during job 3 once its step-2 checkpoint is on
#      disk, then the same command again: which jobs were skipped, resumed, started, and the final metrics against
#      the uninterrupted sweep of 2.
# CHECK_DIR (outputs/check_sweeps) holds the runs and each command's log; CHECK_STEPS (4) steps per run.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="$(bash scripts/setup.sh | tail -n 1)"
OUT="${CHECK_DIR:-outputs/check_sweeps}"
STEPS="${CHECK_STEPS:-4}"
# the test reward (a random model's answers are all wrong; this one gives every group both rewards)
export PYTHONPATH="$PWD/tests/trainer${PYTHONPATH:+:$PYTHONPATH}"
TINY=(model=tiny logger.mode=disabled data.prompts_per_step=4 rollout.group_size=2 rollout.max_new_tokens=8
      eval.max_problems=4 eval.every_steps=2 trainer.print_samples=0 reward.fn=trainer_rewards:even_length
      reward.num_workers=1 trainer.max_steps="$STEPS" trainer.threads=1)
SWEEP=(-m algorithm=grpo,dapo seed=0,1 trainer.save_every=1)
rm -rf "$OUT"
mkdir -p "$OUT"

# timed NAME LOG COMMAND...: run, print its wall time
timed() {
  local name=$1 log=$2 start
  shift 2
  start=$(date +%s.%N)
  "$@" > "$log" 2>&1 || { echo "$name failed (see $log)"; tail -n 20 "$log"; exit 1; }
  # the load average says how much else the machine ran meanwhile (wall times on a shared machine)
  echo "$name wall time: $(echo "$(date +%s.%N) - $start" | bc) s (load average after: $(cut -d' ' -f1-3 /proc/loadavg))"
}

echo "== 1. submitit_local job of 2 tasks vs trainer.nproc=2"
timed "submitit_local, 2 tasks" "$OUT/submitit.log" "$PY" -m tokenpo.train -m "${TINY[@]}" trainer.nproc=2 \
    hydra/launcher=submitit_local hydra.launcher.tasks_per_node=2 hydra.sweep.dir="$OUT/submitit"
timed "trainer.nproc=2" "$OUT/nproc2.log" "$PY" -m tokenpo.train "${TINY[@]}" trainer.nproc=2 \
    hydra.run.dir="$OUT/nproc2"
"$PY" -m tokenpo.compare.identical "$OUT/submitit/0" "$OUT/nproc2"

echo "== 2. 2 x 2 sweep: sequential vs joblib (2 jobs x 1 thread)"
timed "sequential" "$OUT/sequential.log" "$PY" -m tokenpo.train "${SWEEP[@]}" "${TINY[@]}" \
    hydra.sweep.dir="$OUT/sequential"
timed "joblib, 2 jobs" "$OUT/joblib.log" "$PY" -m tokenpo.train "${SWEEP[@]}" "${TINY[@]}" \
    hydra/launcher=joblib hydra.launcher.n_jobs=2 hydra.sweep.dir="$OUT/joblib"
"$PY" -m tokenpo.compare.identical "$OUT/sequential" "$OUT/joblib"

echo "== 3. the 4-job sweep killed during job 3, then rerun"
# own process group (setsid), so the kill reaches the job, its reward workers and everything else it started
setsid "$PY" -m tokenpo.train "${SWEEP[@]}" "${TINY[@]}" hydra.sweep.dir="$OUT/interrupted" \
    > "$OUT/interrupted.log" 2>&1 &
pid=$!
until [[ -d "$OUT/interrupted/2/checkpoints/step_000002" ]]; do
  kill -0 "$pid" 2>/dev/null || { echo "the sweep ended before job 3 saved step 2"; exit 1; }
  sleep 0.2
done
kill -KILL -- "-$pid"
wait "$pid" || true
echo "killed during job 3 with $(ls "$OUT/interrupted/2/checkpoints" | tr '\n' ' ')on disk"
timed "rerun" "$OUT/rerun.log" "$PY" -m tokenpo.train "${SWEEP[@]}" "${TINY[@]}" hydra.sweep.dir="$OUT/interrupted"
grep -hoE "job [0-9]+: (skipped: finished|resumed|started)|resumed from .* at step [0-9]+" "$OUT/rerun.log"
"$PY" -m tokenpo.compare.identical "$OUT/sequential" "$OUT/interrupted"

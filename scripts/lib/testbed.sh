# Sourced by study.sh, gtpo_norm.sh and gtpo_paper_faithful.sh (after they set PY): the CPU comparison testbed
# they share, and one timed multirun on it. Two policy updates per rollout (trainer.mini_batches=2) so ratios,
# clipping and the TEPO mask act; dynamic sampling draws prompts_per_step prompts a round, at most 2 rounds, and
# fills the batch with all-equal groups when they fall short (bounds the CPU time; verl's recipe: 3x per round,
# 10 rounds, error).
TESTBED=(trainer.mini_batches=2 algorithm.dynamic_sampling.max_gen_batches=2 algorithm.dynamic_sampling.oversample=1
         algorithm.dynamic_sampling.on_exhausted=fill trainer.print_samples=0 logger.mode=disabled)

# timed_sweep NAME OUT STEPS OVERRIDES...: the Hydra multirun into the folder OUT, held-out eval every 2 steps,
# then its wall time
timed_sweep() {
  local name=$1 out=$2 steps=$3 start
  shift 3
  start=$(date +%s)
  "$PY" -m tokenpo.train -m "$@" trainer.max_steps="$steps" "${TESTBED[@]}" eval.every_steps=2 hydra.sweep.dir="$out"
  echo "$name wall time: $(( $(date +%s) - start )) s"
}

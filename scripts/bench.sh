#!/usr/bin/env bash
# The numbers of docs/performance.md: tokenpo against TRL's GRPOTrainer at two shapes
# (8 prompts x 4 x 32 new tokens, 8 x 8 x 128), beta 0.04 and 0, 2 threads; then the micro-benchmarks.
# Run it on a quiet machine: `uptime` load average well under 1 (each JSON records the load around its runs).
# BENCH_STEPS: steps per framework run, the first is warm-up (default 4). Extra arguments go to every bench run.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="$(bash scripts/setup.sh | tail -n 1)"
STEPS="${BENCH_STEPS:-4}"
# TRL is only needed here: the optional `bench` extra
"$PY" -c "import trl" 2>/dev/null || "$PY" -m pip install -q -e ".[bench]"
mkdir -p outputs/bench
uptime
for shape in "4 32" "8 128"; do
  read -r group tokens <<< "$shape"
  for beta in 0.04 0; do
    "$PY" -m tokenpo.bench --vs-trl --prompts 8 --group-size "$group" --max-new-tokens "$tokens" --beta "$beta" \
        --steps "$STEPS" --threads 2 "$@"
  done
  "$PY" -m tokenpo.bench.micro --prompts 8 --group-size "$group" --max-new-tokens "$tokens" --threads 2 \
      > "outputs/bench/micro_8x${group}x${tokens}.json"
done
uptime

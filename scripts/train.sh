#!/usr/bin/env bash
# The main job: set up, then train the embedded default (GRPO on SmolLM2-135M-Instruct, built-in arithmetic),
# printing held-out accuracy and sample answers before and after training, and the run dir.
# Extra arguments are Hydra overrides, e.g. `bash scripts/train.sh algorithm=dapo seed=1`.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="$(bash scripts/setup.sh | tail -n 1)"
# W&B logs offline unless an API key is configured (logger.mode=auto); two threads suit this 2-core default
exec "$PY" -m tokenpo.train "$@"

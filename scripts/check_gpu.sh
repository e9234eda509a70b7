#!/usr/bin/env bash
# The GPU check for a short, offline GPU slot: ONE command, under 8 minutes. Installs tokenpo and what it
# needs beyond the GPU image from a folder of wheels with no package index (at most 60 s), then runs
# scripts/gpu_check.py, whose parts (docs/memory.md, "The GPU check") each run under their own timeout inside what is
# left of the 470 s. Into the output folder, as each part finishes: gpu_check.md (the table, rewritten after each
# part), <part>.log and <part>.json; a run stopped at any point keeps the rows and logs of the parts it finished.
#   here:        bash scripts/gpu_wheels.sh                  # builds gpu_wheels/ (~7 MB), carried with the checkout
#   on the GPU:  bash scripts/check_gpu.sh "$OUT"            # default folder: outputs/check_gpu
#   rehearsal:   DEVICE=cpu bash scripts/check_gpu.sh /tmp/x # the same parts at tiny sizes on CPU, this venv
# The image: Python 3.12 with torch (CUDA), transformers, accelerate, peft, safetensors, numpy, matplotlib, psutil,
# pytest. vLLM is not in it and its CUDA wheel cannot travel: the vllm engine's GPU path stays unverified here.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
OUT="$(mkdir -p "${1:-outputs/check_gpu}" && cd "${1:-outputs/check_gpu}" && pwd)"
DEVICE="${DEVICE:-cuda}"
if [ "$DEVICE" = cuda ]; then
  # the whole command's wall-clock budget, seconds (the slot allows 600 a command; 8 minutes leaves room to rerun)
  TOTAL_S="${GPU_CHECK_TOTAL_S:-470}"
  command -v nvidia-smi >/dev/null || { echo "check_gpu: no nvidia-smi, no GPU here" >&2; exit 1; }
  nvidia-smi -L | tee "$OUT/nvidia-smi.log"
  WHEELS="${WHEELS:-gpu_wheels}"
  [ -n "$(ls "$WHEELS"/*.whl 2>/dev/null)" ] \
    || { echo "check_gpu: no wheels in $WHEELS (bash scripts/gpu_wheels.sh)" >&2; exit 1; }
  VENV="${TOKENPO_GPU_VENV:-.venv-gpu}"
  # the image's packages stay visible; the wheels' versions win inside the venv
  [ -x "$VENV/bin/python" ] || python3 -m venv --system-site-packages "$VENV"
  timeout 60 "$VENV/bin/python" -m pip install -q --no-index --no-deps "$WHEELS"/*.whl >"$OUT/install.log" 2>&1 \
    || { echo "check_gpu: the offline install failed or took over 60 s ($OUT/install.log):" >&2
         tail -n 5 "$OUT/install.log" >&2; exit 1; }
  PY="$VENV/bin/python"
else
  # the rehearsal's parts have CPU timeouts (2 shared cores): the budget is theirs, not the slot's
  TOTAL_S="${GPU_CHECK_TOTAL_S:-1500}"
  PY="${PY:-.venv/bin/python}"
fi
export WANDB_MODE=disabled HF_HUB_OFFLINE=1
# the checkout's tokenpo wins over the wheel's copy, built when gpu_wheels.sh ran (the package may have changed since)
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
left=$((TOTAL_S - (SECONDS - start)))
echo "check_gpu: install took $((SECONDS - start)) s; the parts get $left s"
"$PY" scripts/gpu_check.py --device "$DEVICE" --out "$OUT" --budget "$left"

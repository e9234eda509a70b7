#!/usr/bin/env bash
# Builds, here (with the package registry), the folder of wheels that scripts/check_gpu.sh installs with --no-index
# on a GPU machine that reaches no registry: everything tokenpo needs beyond that machine's image (Python 3.12 with
# torch, transformers, accelerate, peft, safetensors, numpy, matplotlib, psutil, pytest), at this venv's versions.
#   bash scripts/gpu_wheels.sh [folder]        # default: gpu_wheels/ (git-ignored); prints its size
#   GPU_PYTHON=3.11 bash scripts/gpu_wheels.sh  # binary wheels for another Python (tests/test_gpu_wheels.py: this one's)
#   PY=.venv/bin/python bash scripts/gpu_wheels.sh  # from an existing environment, without running setup.sh
# Pure-Python wheels are built here where the registry has only source: antlr4-python3-runtime 4.9.3 (Hydra's pin)
# and DeepSpeed without its compiled ops (DS_BUILD_OPS=0: they JIT-build where needed). Binary packages come as
# CPython 3.12 manylinux wheels. Left out, and why:
#   - wandb (20 MB): runs log with logger.mode=disabled; tokenpo imports wandb only to log to it
#   - trl, datasets and pyarrow (55 MB): over the 64 MiB a GPU slot receives, so the TRL comparison is skipped there
#   - vllm: its CUDA wheel is hundreds of MB; its GPU path stays unverified until a machine with vLLM installed
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-gpu_wheels}"
PYVER="${GPU_PYTHON:-3.12}"
# PY: a Python whose environment already holds tokenpo's dependencies (default: the one scripts/setup.sh makes)
PY="${PY:-$(bash scripts/setup.sh | tail -n 1)}"
# beyond the image: tokenpo's own dependencies (hydra, deepspeed, math-verify, gguf) and theirs; PEFT as well, though
# the image has one: tokenpo.train refuses a PEFT outside tokenpo/versions.py's range, and this venv's is inside it
BINARY=(pydantic-core msgpack ninja)
PURE=(hydra-core omegaconf math-verify latex2sympy2_extended gguf hjson py-cpuinfo pydantic annotated-types
      typing-inspection typing-extensions einops peft)
pin() { "$PY" -c "import sys; from importlib.metadata import version; print(*(f'{n}=={version(n)}' for n in sys.argv[1:]))" "$@"; }
rm -rf "$OUT"
mkdir -p "$OUT"
# source-only on the registry: pure-Python wheels built here
"$PY" -m pip wheel -q --no-deps -w "$OUT" "$(pin antlr4-python3-runtime)"
DS_BUILD_OPS=0 "$PY" -m pip wheel -q --no-deps --no-build-isolation -w "$OUT" "$(pin deepspeed)"
# wheels as published: pure ones for any Python, binary ones for CPython $PYVER on x86-64 Linux
"$PY" -m pip download -q --no-deps --only-binary=:all: -d "$OUT" $(pin "${PURE[@]}")
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$PYVER" --implementation cp --abi "cp${PYVER/./}" \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d "$OUT" $(pin "${BINARY[@]}")
# tokenpo itself, from a copy of the checkout (no build/ folder left here)
src="$(mktemp -d)"
trap 'rm -rf "$src"' EXIT
cp -rL pyproject.toml README.md tokenpo "$src/"
"$PY" -m pip wheel -q --no-deps --no-build-isolation -w "$OUT" "$src"
ls "$OUT"
du -sh "$OUT"

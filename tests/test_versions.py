"""tokenpo.versions: the supported DeepSpeed and PEFT ranges, the same as pyproject.toml's pins, and the start-up
refusal of a release outside them (faked versions here; a fake installed distribution for the command line)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import tomllib
from importlib.metadata import PackageNotFoundError
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

from tokenpo.errors import ConfigError
from tokenpo.versions import DEEPSPEED, PEFT, SUPPORTED, check_supported_versions

REPO = Path(__file__).resolve().parents[1]
IN_RANGE = {"deepspeed": "0.19.8", "peft": "0.21.2"}


def faked(**versions: str):
    """importlib.metadata.version as a machine with these versions (the others in range) answers it."""
    table = dict(IN_RANGE, **versions)

    def version(package: str) -> str:
        if table[package] is None:
            raise PackageNotFoundError(package)
        return table[package]

    return version


def test_pyproject_pins_the_supported_ranges():
    dependencies = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    pins = {req.name: req.specifier for req in map(Requirement, dependencies)}
    for supported in SUPPORTED:
        assert pins[supported.package] == SpecifierSet(supported.specifier), supported.package


def test_the_ranges():
    assert (DEEPSPEED.specifier, PEFT.specifier) == (">=0.19.5,<0.20", ">=0.18.0,<0.22")


def test_this_environment_is_supported():
    check_supported_versions()


@pytest.mark.parametrize("package, version", [
    ("deepspeed", "0.19.5"), ("deepspeed", "0.19.8"), ("deepspeed", "0.19.99"),
    # a local build label is ignored; a pre-release inside the range counts
    ("deepspeed", "0.19.8+cu124"), ("deepspeed", "0.19.5+d3dcf9a"), ("deepspeed", "0.19.6rc1"),
    ("deepspeed", "0.19.6.dev0"), ("peft", "0.18.0"), ("peft", "0.21.2"), ("peft", "0.21.3.dev0+local"),
])
def test_in_range_is_accepted(package, version):
    check_supported_versions(faked(**{package: version}))


@pytest.mark.parametrize("package, version", [
    ("deepspeed", "0.15.4"), ("deepspeed", "0.19.3"), ("deepspeed", "0.19.4"), ("deepspeed", "0.20.0"),
    # the label does not lift 0.19.4; pre-releases of the bounds sort outside the range
    ("deepspeed", "0.19.4+cu124"), ("deepspeed", "0.19.5rc1"), ("deepspeed", "0.19.5.dev0"),
    ("deepspeed", "0.20.0rc1"), ("deepspeed", "1.0"), ("peft", "0.13.2"), ("peft", "0.17.1"), ("peft", "0.22.0"),
    ("peft", "0.22.0.dev0"),
])
def test_out_of_range_is_refused(package, version):
    with pytest.raises(ConfigError) as err:
        check_supported_versions(faked(**{package: version}))
    assert str(err.value).startswith(f"{package} {version} is not supported (needs ")


def test_the_refusal_says_why_in_one_line():
    with pytest.raises(ConfigError) as err:
        check_supported_versions(faked(deepspeed="0.19.3"))
    assert str(err.value) == (
        "deepspeed 0.19.3 is not supported (needs >=0.19.5,<0.20: older releases ignore managed_gradient_accumulation, "
        "and ZeRO-1 and ZeRO-2 then keep only the last micro-batch's gradient; 0.19.4 refuses it with ZeRO offload); "
        "pip install 'deepspeed>=0.19.5,<0.20'")
    with pytest.raises(ConfigError) as err:
        check_supported_versions(faked(peft="0.17.1"))
    assert str(err.value) == (
        "peft 0.17.1 is not supported (needs >=0.18.0,<0.22: older releases do not import under transformers 5 "
        "(they import its removed HybridCache)); pip install 'peft>=0.18.0,<0.22'")


def test_an_unreadable_or_missing_version_is_refused():
    with pytest.raises(ConfigError, match=r"^deepspeed unknown is not supported \(needs >=0.19.5,<0.20"):
        check_supported_versions(faked(deepspeed="unknown"))
    with pytest.raises(ConfigError, match=r"^peft is not installed \(needs >=0.18.0,<0.22\); pip install"):
        check_supported_versions(faked(peft=None))


def fake_distribution(site: Path, name: str, version: str) -> None:
    """A distribution's metadata folder: on PYTHONPATH it comes before site-packages, so importlib.metadata reads its
    version first (the package itself still imports from site-packages)."""
    info = site / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


def test_the_command_line_refuses_an_old_deepspeed_in_one_line_within_2_s(tmp_path):
    fake_distribution(tmp_path / "site", "deepspeed", "0.19.3")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(tmp_path / "site"),
                                                                     os.environ.get("PYTHONPATH")])))
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "tokenpo.train", "model=tiny", f"hydra.run.dir={tmp_path / 'run'}"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    elapsed = time.perf_counter() - start
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.splitlines() == [f"tokenpo: error: deepspeed 0.19.3 is not supported (needs >=0.19.5,<0.20: "
                                        f"{DEEPSPEED.why}); pip install 'deepspeed>=0.19.5,<0.20'"]
    assert not (tmp_path / "run").exists()
    # the 2 s budget of start-up errors (scripts/bench_startup_errors.py), loose against a busy machine
    assert elapsed < 4, elapsed

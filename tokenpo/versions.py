"""The DeepSpeed and PEFT releases tokenpo supports, refused in one line at start-up when another one is installed.

pyproject.toml pins the same ranges for an install (tests/test_versions.py checks that the two agree); this check
covers a machine whose packages came from elsewhere: an image's own PEFT, a DeepSpeed built from source, an
environment installed before the pin. It reads the installed versions from the packages' metadata, without
importing them (torch comes with both), so a refused start takes milliseconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from typing import Callable

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from tokenpo.errors import ConfigError


@dataclass(frozen=True)
class SupportedRange:
    """`package` from release `minimum` up to, not including, `below` (the next minor release, not yet tested)."""

    package: str
    minimum: str
    below: str
    why: str  # what a release outside the range gets wrong

    @property
    def specifier(self) -> str:
        return f">={self.minimum},<{self.below}"

    def admits(self, installed: str) -> bool:
        """Whether the installed version string is in the range; a local build label (`0.19.8+cu124`) is ignored
        and a pre-release counts where it sorts (`0.19.6rc1` is in, `0.19.5rc1` and `0.20.0rc1` are out)."""
        return SpecifierSet(self.specifier).contains(Version(installed), prereleases=True)


DEEPSPEED = SupportedRange(
    "deepspeed", "0.19.5", "0.20",
    "older releases ignore managed_gradient_accumulation, and ZeRO-1 and ZeRO-2 then keep only the last micro-batch's "
    "gradient; 0.19.4 refuses it with ZeRO offload")
PEFT = SupportedRange(
    "peft", "0.18.0", "0.22",
    "older releases do not import under transformers 5 (they import its removed HybridCache)")
# PEFT is checked on every run, not only when model.lora.rank >= 1: tokenpo.models.loading imports it on every run
SUPPORTED = (DEEPSPEED, PEFT)


def unsupported_reason(supported: SupportedRange, installed: str) -> str | None:
    """The one-line refusal of `installed`, or None when it is in the range."""
    try:
        if supported.admits(installed):
            return None
    except InvalidVersion:
        pass
    return (f"{supported.package} {installed} is not supported (needs {supported.specifier}: {supported.why}); "
            f"pip install '{supported.package}{supported.specifier}'")


def check_supported_versions(installed_version: Callable[[str], str] = version) -> None:
    """Raise ConfigError naming the first package that is missing or outside its supported range
    (`installed_version`: importlib.metadata's, which reads the version without importing the package)."""
    for each in SUPPORTED:
        try:
            installed = installed_version(each.package)
        except PackageNotFoundError:
            raise ConfigError(f"{each.package} is not installed (needs {each.specifier}); "
                              f"pip install '{each.package}{each.specifier}'") from None
        reason = unsupported_reason(each, installed)
        if reason is not None:
            raise ConfigError(reason)

"""Package namespaces whose names import on first use (PEP 562).

A package's __init__ that imported every module would make its lightest module (a config schema read at start-up)
cost the heaviest one's imports (torch, transformers, math-verify): start-up checks run before those load.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable


def lazy_exports(package: str, exports: dict[str, tuple[str, ...]]) -> tuple[Callable[[str], Any], list[str]]:
    """(`__getattr__`, `__all__`) for `package`'s __init__: each name in exports[module] is read from
    `package.module` the first time it is asked for."""
    home = {name: module for module, names in exports.items() for name in names}

    def __getattr__(name: str) -> Any:
        if name not in home:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{home[name]}"), name)

    return __getattr__, sorted(home)

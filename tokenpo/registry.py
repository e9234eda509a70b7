"""Name -> function registries: every pluggable piece (algorithm parts, rollout engines, data loaders, answer
extractors) is looked up by the name a config gives.

The trainer never branches on an algorithm's name: a config names registry entries and the functions are
looked up by those names. Entries may carry traits (e.g. whether an advantage estimator needs the old policy's
entropy) so callers ask the registry, not the name.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any, Callable

from tokenpo.errors import ConfigError


class Registry:
    """A named set of functions; `get` of an unknown name raises a one-line ConfigError listing the known ones."""

    def __init__(self, kind: str, entries: Mapping[str, Callable[..., Any]] | None = None) -> None:
        self.kind = kind
        self._functions: dict[str, Callable[..., Any]] = {}
        self._traits: dict[str, dict[str, Any]] = {}
        # name -> module that registers it when imported (declared entries whose module imports heavy libraries)
        self._modules: dict[str, str] = {}
        for name, function in (entries or {}).items():
            self.add(name, function)

    def add(self, name: str, function: Callable[..., Any], **traits: Any) -> Callable[..., Any]:
        if name in self._functions or (name in self._traits and name not in self._modules):
            raise ValueError(f"{self.kind} {name!r} is already registered")
        self._functions[name] = function
        self._traits[name] = {**self._traits.get(name, {}), **traits}
        return function

    def declare(self, name: str, module: str, **traits: Any) -> None:
        """Name an entry (and its traits) that `module` registers when imported: the name validates a config and its
        traits answer without importing the module, which `get` imports on first use."""
        if name in self._traits:
            raise ValueError(f"{self.kind} {name!r} is already registered")
        self._modules[name] = module
        self._traits[name] = traits

    def register(self, name: str, **traits: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Decorator form of `add`."""
        return lambda function: self.add(name, function, **traits)

    def names(self) -> list[str]:
        return sorted(self._traits)

    def check(self, name: str) -> None:
        """A one-line ConfigError for an unknown name; a declared entry stays unloaded."""
        if name not in self._traits:
            raise ConfigError(f"unknown {self.kind} {name!r}; known: {', '.join(self.names())}")

    def get(self, name: str) -> Callable[..., Any]:
        self.check(name)
        if name not in self._functions:
            importlib.import_module(self._modules[name])
            if name not in self._functions:
                raise RuntimeError(f"{self._modules[name]} did not register {self.kind} {name!r}")
        return self._functions[name]

    def trait(self, name: str, trait: str) -> Any:
        """The trait's value for `name`, or None when the entry did not declare it."""
        self.check(name)
        return self._traits[name].get(trait)

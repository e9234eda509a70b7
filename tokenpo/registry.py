"""Name -> function registries: every pluggable piece (algorithm parts, rollout engines, data loaders, answer
extractors) is looked up by the name a config gives.

The trainer never branches on an algorithm's name: a config names registry entries and the functions are
looked up by those names. Entries may carry traits (e.g. whether an advantage estimator needs the old policy's
entropy) so callers ask the registry, not the name.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Callable

from tokenpo.errors import ConfigError


class Registry:
    """A named set of functions; `get` of an unknown name raises a one-line ConfigError listing the known ones."""

    def __init__(self, kind: str, entries: Mapping[str, Callable[..., Any]] | None = None) -> None:
        self.kind = kind
        self._functions: dict[str, Callable[..., Any]] = {}
        self._traits: dict[str, dict[str, Any]] = {}
        for name, function in (entries or {}).items():
            self.add(name, function)

    def add(self, name: str, function: Callable[..., Any], **traits: Any) -> Callable[..., Any]:
        if name in self._functions:
            raise ValueError(f"{self.kind} {name!r} is already registered")
        self._functions[name] = function
        self._traits[name] = traits
        return function

    def register(self, name: str, **traits: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Decorator form of `add`."""
        return lambda function: self.add(name, function, **traits)

    def names(self) -> list[str]:
        return sorted(self._functions)

    def _check(self, name: str) -> None:
        if name not in self._functions:
            raise ConfigError(f"unknown {self.kind} {name!r}; known: {', '.join(self.names())}")

    def get(self, name: str) -> Callable[..., Any]:
        self._check(name)
        return self._functions[name]

    def trait(self, name: str, trait: str) -> Any:
        """The trait's value for `name`, or None when the entry did not declare it."""
        self._check(name)
        return self._traits[name].get(trait)

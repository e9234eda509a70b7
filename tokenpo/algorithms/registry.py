"""Name -> function registries for the pluggable pieces of an algorithm.

The trainer never branches on an algorithm's name: a config names registry entries and the
functions here are looked up by those names. Entries may carry traits (e.g. whether an
advantage estimator needs the old policy's entropy) so callers ask the registry, not the name.
"""

from __future__ import annotations

from typing import Any, Callable


class Registry:
    """A named set of functions; `get` of an unknown name raises a ValueError listing the known ones."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._functions: dict[str, Callable[..., Any]] = {}
        self._traits: dict[str, dict[str, Any]] = {}

    def register(self, name: str, **traits: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        def add(function: Callable[..., Any]) -> Callable[..., Any]:
            if name in self._functions:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._functions[name] = function
            self._traits[name] = traits
            return function

        return add

    def names(self) -> list[str]:
        return sorted(self._functions)

    def _check(self, name: str) -> None:
        if name not in self._functions:
            raise ValueError(f"unknown {self.kind} {name!r}; known: {', '.join(self.names())}")

    def get(self, name: str) -> Callable[..., Any]:
        self._check(name)
        return self._functions[name]

    def trait(self, name: str, trait: str) -> Any:
        """The trait's value for `name`, or None when the entry did not declare it."""
        self._check(name)
        return self._traits[name].get(trait)

"""Build typed config dataclasses from plain dicts, rejecting unknown keys with a one-line message."""

from __future__ import annotations

import dataclasses
import typing
from typing import Any, TypeVar

from tokenpo.errors import ConfigError

T = TypeVar("T")


def from_dict(cls: type[T], values: dict[str, Any], prefix: str) -> T:
    """`cls(**values)` recursively for nested dataclasses; `prefix` names the config key in errors."""
    if not isinstance(values, dict):
        raise ConfigError(f"{prefix} must be a mapping, got {values!r}")
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ConfigError(f"unknown {prefix} keys: {', '.join(unknown)} (known: {', '.join(sorted(known))})")
    kwargs = {}
    for name, value in values.items():
        hint = hints[name]
        if dataclasses.is_dataclass(hint) and isinstance(value, dict):
            value = from_dict(hint, value, f"{prefix}.{name}")
        elif hint in (tuple, typing.Tuple) or typing.get_origin(hint) is tuple:
            value = tuple(value or ())
        kwargs[name] = value
    obj = cls(**kwargs)
    if hasattr(obj, "validate"):
        obj.validate()
    return obj

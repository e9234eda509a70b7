"""Build typed config dataclasses from plain dicts: unknown keys and wrong types are one-line errors.

Every config group's `*_config_from_dict` goes through `from_dict`, then runs its own `validate()`.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

from tokenpo.errors import ConfigError

T = TypeVar("T")


def from_dict(cls: type[T], values: Any, prefix: str) -> T:
    """`cls(**values)`, recursing into dataclass-typed fields; `prefix` names the config key in errors.

    Absent keys take the dataclass defaults. Validation of values is left to the caller's `validate()`.
    """
    if not isinstance(values, Mapping):
        raise ConfigError(f"{prefix} must be a mapping, got {values!r}")
    known = sorted(f.name for f in dataclasses.fields(cls))
    unknown = sorted(set(values) - set(known))
    if unknown:
        keys = ", ".join(f"{prefix}.{k}" for k in unknown)
        raise ConfigError(f"unknown key{'s' if len(unknown) > 1 else ''} {keys} (known: {', '.join(known)})")
    hints = typing.get_type_hints(cls)
    return cls(**{name: coerce(value, hints[name], f"{prefix}.{name}") for name, value in values.items()})


def coerce(value: Any, hint: Any, key: str) -> Any:
    """`value` as the field type `hint`: ints pass as floats, lists as tuples, bools never as numbers."""
    union = typing.get_origin(hint) in (typing.Union, types.UnionType)
    options = typing.get_args(hint) if union else (hint,)
    for option in options:
        origin = typing.get_origin(option) or option
        if option is type(None):
            if value is None:
                return None
        elif dataclasses.is_dataclass(option):
            if isinstance(value, Mapping):
                return from_dict(option, value, key)
        elif origin is float:
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return float(value)
        elif origin in (list, tuple):
            if isinstance(value, (list, tuple)):
                return origin(value)
        elif origin is dict:
            if isinstance(value, Mapping):
                return dict(value)
        elif origin is Any or type(value) is origin:
            return value
    names = " or ".join(_type_name(o) for o in options)
    raise ConfigError(f"{key} must be {names}, got {value!r}")


def _type_name(option: Any) -> str:
    if option is type(None):
        return "null"
    if dataclasses.is_dataclass(option):
        return "a mapping"
    return getattr(typing.get_origin(option) or option, "__name__", str(option))

"""Typed config dataclasses: each key written once, and checked in one style.

A field is declared with `setting(default, help, <constraint>)`: its help is the YAML comment above the key in the
group's default file (tests/test_conf.py compares them), its constraint (bounds, choices, a predicate) is checked by
`check_fields` with one message format, `<key> must be <requirement>, got <value>`. `from_dict` builds a dataclass
from a plain dict (unknown keys and wrong types are one-line errors); each config's `validate()` runs
`check_fields`, then its cross-field rules, each one `require(ok, message)`.
"""

from __future__ import annotations

import dataclasses
import functools
import keyword
import math
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from tokenpo.errors import ConfigError

T = TypeVar("T")


@dataclass(frozen=True)
class Rule:
    """A field's own constraint; a null value of an optional field always passes it.

    `choices` may be a function (a registry's `names`), read when a value is checked, so entries registered after
    import count. `requirement` words the message where the generated wording (`>= 1`, `in (0, 1]`, `one of a, b`,
    `null or ...`) is not the one users and tests already read.
    """

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    finite: bool = False
    choices: Sequence | Callable[[], Sequence] | None = None
    check: Callable[[Any], bool] | None = None
    requirement: str | None = None

    def options(self) -> Sequence:
        return self.choices() if callable(self.choices) else self.choices

    def holds(self, value: Any, number: type | None) -> bool:
        """Whether `value` meets the rule; `number` (int or float, from the field's type) for bounds and finite."""
        if self.choices is not None and value not in self.options():
            return False
        if self.check is not None and not self.check(value):
            return False
        if number is None or not (self.finite or self._bounds()):
            return True
        if isinstance(value, bool) or not isinstance(value, (int, float) if number is float else int):
            return False
        return ((not self.finite or math.isfinite(value))
                and (self.ge is None or value >= self.ge) and (self.gt is None or value > self.gt)
                and (self.le is None or value <= self.le) and (self.lt is None or value < self.lt))

    def wording(self, optional: bool) -> str:
        """What the message says a value must be."""
        if self.requirement is not None:
            return self.requirement
        if self.choices is not None:
            text = f"one of {', '.join(str(option) for option in self.options())}"
        else:
            text = " ".join(part for part in ("a finite number" if self.finite else "", self._range()) if part)
        return f"null or {text}" if optional else text

    def _bounds(self) -> bool:
        return any(bound is not None for bound in (self.ge, self.gt, self.le, self.lt))

    def _range(self) -> str:
        """The bounds as the messages write them: `>= 1`, `> 0`, `in [0, 1)`."""
        low = f"[{self.ge}" if self.ge is not None else f"({self.gt}" if self.gt is not None else ""
        high = f"{self.le}]" if self.le is not None else f"{self.lt})" if self.lt is not None else ""
        if low and high:
            return f"in {low}, {high}"
        signs = {"[": ">=", "(": ">", "]": "<=", ")": "<"}
        if low:
            return f"{signs[low[0]]} {low[1:]}"
        return f"{signs[high[-1]]} {high[:-1]}" if high else ""


def setting(default: Any, help: str, *, ge: float | None = None, gt: float | None = None, le: float | None = None,
            lt: float | None = None, finite: bool = False, choices: Sequence | Callable[[], Sequence] | None = None,
            check: Callable[[Any], bool] | None = None, requirement: str | None = None,
            shipped: str | None = None, applies: Callable[[Any], bool] | None = None) -> Any:
    """A config field: its default, its help (what, unit, paper value and section: the YAML comment above the key
    in the group's default file), its constraint (`Rule`), `shipped`: why the default file sets another value
    than `default`, where it does, and `applies`: whether the value is read at all, given its section (None: always;
    e.g. a KL term's target only with its coefficient above 0)."""
    constrained = finite or choices is not None or check is not None or any(
        bound is not None for bound in (ge, gt, le, lt))
    rule = Rule(ge, gt, le, lt, finite, choices, check, requirement) if constrained else None
    metadata = {"help": help, "rule": rule, "shipped": shipped, "applies": applies}
    if isinstance(default, list):
        return dataclasses.field(default_factory=functools.partial(list, default), metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def section(cls: type, help: str) -> Any:
    """A field holding a nested config section (a dataclass with defaults of its own)."""
    return dataclasses.field(default_factory=cls, metadata={"help": help, "rule": None, "shipped": None,
                                                             "applies": None})


def must_be(key: str, requirement: str, value: Any) -> str:
    """The one wording of a bad value: `trainer.lr must be > 0, got 0`."""
    return f"{key} must be {requirement}, got {value!r}"


def require(ok: bool, message: str) -> None:
    """A config rule: `message` (one line naming the key) as a ConfigError unless `ok`."""
    if not ok:
        raise ConfigError(message)


def config_key(field_name: str) -> str:
    """The config key of a dataclass field: the name, but a Python keyword (`async`) is written `async_` in the
    dataclass."""
    stem = field_name[:-1]
    return stem if field_name.endswith("_") and keyword.iskeyword(stem) else field_name


def field_name(key: str) -> str:
    """The dataclass field of a config key (config_key's inverse)."""
    return f"{key}_" if keyword.iskeyword(key) else key


def config_dict(cfg: Any) -> dict:
    """`dataclasses.asdict(cfg)` under the config keys (config_key): the mapping the YAML files write."""
    def keyed(value: Any) -> Any:
        if isinstance(value, dict):
            return {config_key(key): keyed(item) for key, item in value.items()}
        if isinstance(value, (list, tuple)):
            return type(value)(keyed(item) for item in value)
        return value

    return keyed(dataclasses.asdict(cfg))


def check_fields(cfg: Any, prefix: str) -> None:
    """Each field of the dataclass `cfg` (not its sections: each checks its own) against its `setting` rule."""
    hints = _hints(type(cfg))
    for spec in dataclasses.fields(cfg):
        rule = spec.metadata.get("rule")
        if rule is not None:
            check_value(rule, getattr(cfg, spec.name), hints[spec.name], f"{prefix}.{config_key(spec.name)}")


def check_value(rule: Rule, value: Any, hint: Any, key: str) -> None:
    """`value` against a field's rule; `hint` (the field's type) says whether null passes and what a number is."""
    options = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    optional = type(None) in options
    if value is None and optional:
        return
    number = next((option for option in (float, int) if option in options), None)
    require(rule.holds(value, number), must_be(key, rule.wording(optional), value))


def check_field(cls: type, name: str, value: Any, key: str) -> None:
    """`value`, which comes from elsewhere (a dataset's default), against the rule of the field `name` of `cls`."""
    spec = next(spec for spec in dataclasses.fields(cls) if spec.name == name)
    check_value(spec.metadata["rule"], value, _hints(cls)[name], key)


def non_empty(value: Any) -> bool:
    """A string with something in it besides spaces."""
    return isinstance(value, str) and bool(value.strip())


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def from_dict(cls: type[T], values: Any, prefix: str) -> T:
    """`cls(**values)`, recursing into dataclass-typed fields; `prefix` names the config key in errors.

    Absent keys take the dataclass defaults. Validation of values is left to the caller's `validate()`.
    """
    if not isinstance(values, Mapping):
        raise ConfigError(f"{prefix} must be a mapping, got {values!r}")
    known = sorted(config_key(f.name) for f in dataclasses.fields(cls))
    unknown = sorted(set(values) - set(known))
    if unknown:
        keys = ", ".join(f"{prefix}.{k}" for k in unknown)
        raise ConfigError(f"unknown key{'s' if len(unknown) > 1 else ''} {keys} (known: {', '.join(known)})")
    hints = typing.get_type_hints(cls)
    return cls(**{field_name(key): coerce(value, hints[field_name(key)], f"{prefix}.{key}")
                  for key, value in values.items()})


def build(cls: type[T], values: Any, prefix: str) -> T:
    """`from_dict`, then the config's own `validate()` (its fields' rules and its cross-field rules)."""
    cfg = from_dict(cls, values, prefix)
    cfg.validate()
    return cfg


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

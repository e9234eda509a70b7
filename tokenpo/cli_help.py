"""Help on tokenpo.train's command line, from the same `setting(...)` that checks each key (tokenpo.schema):

    python -m tokenpo.train --help                                  # short: usage, the groups, where to look
    python -m tokenpo.train --explain algorithm.loss.clip_high      # one key: help, type, default, rule, this run
    python -m tokenpo.train --explain clip_high algorithm=dapo      # a unique short name; the value under overrides
    python -m tokenpo.train --explain rollout                       # a group or section: each key with its help

`--info` and `--cfg` take their own value before the overrides; `normalize_hydra_flags` puts it there when it is
left out (`--cfg algorithm=dapo` runs as `--cfg job algorithm=dapo`), so overrides are accepted after either.
"""

from __future__ import annotations

import dataclasses
import difflib
import textwrap
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenpo.config import GROUPS, TrainConfig
from tokenpo.errors import ConfigError
from tokenpo.schema import config_key

# Hydra's --info values (argparse nargs="?": a following override was read as one of them) and --cfg's (required)
INFO_CHOICES = ("all", "config", "defaults", "defaults-tree", "plugins", "searchpath")
CFG_CHOICES = ("job", "hydra", "all")
WIDTH = 110


@dataclass(frozen=True)
class Key:
    """One config key and the dataclass field that declares it."""

    key: str  # e.g. algorithm.loss.clip_high
    field: dataclasses.Field
    hint: Any  # the field's type

    @property
    def is_section(self) -> bool:
        return dataclasses.is_dataclass(self.hint)

    @property
    def help(self) -> str:
        return self.field.metadata.get("help", "")

    @property
    def default(self) -> Any:
        if self.field.default is not dataclasses.MISSING:
            return self.field.default
        return self.field.default_factory() if not self.is_section else None


def group_classes() -> dict[str, type]:
    """Each config group's dataclass, read from TrainConfig's fields."""
    hints = typing.get_type_hints(TrainConfig)
    return {group: hints[group] for group in GROUPS}


def all_keys() -> list[Key]:
    """Every key of the training config, sections included, in declaration order."""
    def walk(cls: type, prefix: str) -> Iterator[Key]:
        hints = typing.get_type_hints(cls)
        for spec in dataclasses.fields(cls):
            hint = hints[spec.name]
            key = Key(f"{prefix}.{config_key(spec.name)}", spec, hint)
            yield key
            if key.is_section:
                yield from walk(hint, key.key)

    return [key for group, cls in group_classes().items() for key in walk(cls, group)]


def find(query: str, keys: list[Key]) -> list[Key]:
    """The keys `query` names: the key itself; else the keys ending in its last part under its first part
    (`algorithm.clip_high` is algorithm.loss.clip_high; `clip_high` alone searches every group)."""
    exact = [key for key in keys if key.key == query]
    if exact:
        return exact
    head, _, last = query.rpartition(".")
    return [key for key in keys
            if key.key.rpartition(".")[2] == last and (not head or key.key.startswith(head.split(".")[0] + "."))
            and all(part in key.key.split(".") for part in head.split(".") if part)]


def rule_text(key: Key) -> str:
    rule = key.field.metadata.get("rule")
    if rule is None:
        return "any value of its type"
    optional = type(None) in typing.get_args(key.hint)
    return rule.wording(optional)


def type_text(hint: Any) -> str:
    names = [getattr(option, "__name__", str(option)) for option in (typing.get_args(hint) or (hint,))]
    return " | ".join("null" if name == "NoneType" else name for name in names)


def value_text(value: Any) -> str:
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def explain_key(key: Key, value: Any, overrides: list[str]) -> str:
    lines = [f"{key.key}  ({type_text(key.hint)})",
             *textwrap.wrap(key.help, WIDTH, initial_indent="  ", subsequent_indent="  "),
             f"  default: {value_text(key.default)}"]
    shipped = key.field.metadata.get("shipped")
    if shipped:
        lines.append(f"  (the group's file sets another value: {shipped})")
    lines.append(f"  in this run{' (' + ' '.join(overrides) + ')' if overrides else ''}: {value_text(value)}")
    lines.append(f"  rule: {rule_text(key)}")
    return "\n".join(lines)


def explain_section(prefix: str, keys: list[Key], values: dict, options: list[str]) -> str:
    """Every key under `prefix` on one line: `key = value  help`."""
    lines = [f"{prefix}: {key.help}" for key in keys if key.key == prefix]
    if options:
        lines.append(f"options ({prefix}=<option>): {', '.join(options)}")
    for key in keys:
        if key.key.startswith(prefix + ".") and not key.is_section:
            text = f"{key.key} = {value_text(lookup(values, key.key))}  # {key.help}"
            lines += textwrap.wrap(text, WIDTH, subsequent_indent="      ")
    lines.append(f"one key in full: --explain {prefix}.<key>")
    return "\n".join(lines)


def lookup(values: dict, key: str) -> Any:
    node: Any = values
    for part in key.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def group_options(conf_dir: str, group: str) -> list[str]:
    folder = Path(conf_dir) / group
    return sorted(str(path.relative_to(folder).with_suffix("")) for path in folder.rglob("*.yaml")) \
        if folder.is_dir() else []


def explain(query: str, values: dict, overrides: list[str], conf_dir: str) -> str:
    """What `--explain query` prints; `values`: the run's composed config under `overrides` (config_dict per
    group)."""
    keys = all_keys()
    if query in GROUPS or query == "experiment" or any(key.key == query and key.is_section for key in keys):
        return explain_section(query, keys, values, group_options(conf_dir, query))
    if query == "seed":
        return (f"seed  (int)\n  Global seed: model init (tiny), data order, sampling and dropout all derive from it\n"
                f"  default: 0\n  in this run: {values.get('seed')}\n  rule: a non-negative integer")
    found = find(query, keys)
    if not found:
        close = difflib.get_close_matches(query, [key.key for key in keys], n=5, cutoff=0.6)
        hint = f"; did you mean {', '.join(close)}?" if close else "; --explain <group> lists a group's keys"
        raise ConfigError(f"--explain {query}: no such key{hint}")
    if len(found) > 1:
        raise ConfigError(f"--explain {query} names {len(found)} keys: {', '.join(key.key for key in found)}; "
                          "give one in full")
    key = found[0]
    if key.is_section:
        return explain_section(key.key, keys, values, [])
    text = explain_key(key, lookup(values, key.key), overrides)
    return text if key.key == query else f"({query} is {key.key})\n{text}"


def short_help(conf_dir: str) -> str:
    """`--help`: how to call tokenpo.train, its config groups and options, and where the rest is."""
    groups = "\n".join(textwrap.fill(f"{group}: {', '.join(group_options(conf_dir, group))}", WIDTH,
                                     initial_indent="  ", subsequent_indent="      ")
                       for group in (*GROUPS, "experiment"))
    return f"""usage: python -m tokenpo.train [group=option ...] [key=value ...] [-m]   (installed: tokenpo-train ...)

RL fine-tuning on math problems. Every setting is an override of the composed config (README, 'Everyday use').

  --explain KEY    a key's help (meaning, unit, paper value), type, default, rule and value in this run, e.g.
                   --explain algorithm.loss.clip_high algorithm=dapo; a group or section lists its keys:
                   --explain rollout
  --cfg job        print the composed config under the overrides that follow (-p GROUP: one group)
  --info           Hydra's view of the config: search path, defaults tree
  -m               a sweep: one job per value of each key=a,b (python -m tokenpo.compare reads its folder)
  --hydra-help     Hydra's own options

config groups (group=option):
{groups}

more: python -m tokenpo.plan <overrides> (memory plan), python -m tokenpo.compare --help, tokenpo-evaluate --help;
docs/metrics.md (every logged metric), docs/experiments.md, docs/algorithms.md"""


def normalize_hydra_flags(argv: list[str]) -> list[str]:
    """`argv` with `--info`'s and `--cfg`'s own value made explicit where an override follows them (Hydra would read
    the override as that value): `--info x=1` -> `--info all x=1`, `--cfg x=1` -> `--cfg job x=1`."""
    out: list[str] = []
    for i, arg in enumerate(argv):
        out.append(arg)
        following = argv[i + 1] if i + 1 < len(argv) else None
        override = following is not None and not following.startswith("-")
        if arg == "--info" and override and following not in INFO_CHOICES:
            out.append("all")
        elif arg in ("--cfg", "-c") and (following is None or following not in CFG_CHOICES):
            out.append("job")
    return out


def explain_request(argv: list[str]) -> tuple[str, list[str]] | None:
    """(the key, the overrides) of `--explain KEY [overrides]` anywhere in `argv`, or None."""
    if "--explain" not in argv:
        return None
    at = argv.index("--explain")
    if at + 1 >= len(argv) or argv[at + 1].startswith("-"):
        raise ConfigError("--explain needs a key, e.g. --explain algorithm.loss.clip_high (a group lists its keys: "
                          "--explain rollout)")
    return argv[at + 1], argv[:at] + argv[at + 2:]

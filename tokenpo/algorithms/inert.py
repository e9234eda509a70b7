"""Which parts of an algorithm cannot act under a run's settings, read from the registries' traits (no list of
algorithms or options kept here: a new registry entry declares its own traits).

Every config field whose choices are a registry's names (`setting(..., choices=REGISTRY.names)`) is looked up in
that registry. An entry's traits say:
- `inert_on_policy`: True (the choice itself does nothing) or the keys of its section it reads only through an
  importance ratio away from 1 (a clip, a gate). With one update per rollout, generated in turn, the policy trained is
  the policy that sampled and every ratio is exactly 1.
- `needs_group`: the entry compares a response with the other responses to its prompt, so one response per prompt
  cannot train; True, or a function of the field's section giving the setting that makes it so (None: it does not).

A field whose `setting(..., applies=...)` says it is not read (a KL term's target with its coefficient at 0) is left
out. Pure and torch-free: start-up (tokenpo.train) calls it before anything heavy is imported.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from tokenpo.registry import Registry
from tokenpo.schema import config_key

ROOT = "algorithm"


@dataclass(frozen=True)
class Choice:
    """A config field that names a registry entry: its key, value, registry and the section holding it."""

    key: str  # e.g. algorithm.loss.surrogate
    value: str
    registry: Registry
    section: Any  # the dataclass the field is in (an entry's keys are read from it)

    def trait(self, name: str) -> Any:
        return self.registry.trait(self.value, name)


def registry_choices(cfg: Any, prefix: str = ROOT) -> Iterator[Choice]:
    """Each field of `cfg` (recursing into its sections) whose value names a registry entry and which is read."""
    for spec in dataclasses.fields(cfg):
        value = getattr(cfg, spec.name)
        key = f"{prefix}.{config_key(spec.name)}"
        if dataclasses.is_dataclass(value):
            yield from registry_choices(value, key)
            continue
        rule, applies = spec.metadata.get("rule"), spec.metadata.get("applies")
        registry = getattr(getattr(rule, "choices", None), "__self__", None)
        if isinstance(registry, Registry) and (applies is None or applies(cfg)):
            yield Choice(key, value, registry, cfg)


def inert_on_policy(cfg: Any) -> list[str]:
    """`key=value` of every setting of the algorithm config `cfg` that does nothing when every importance ratio is 1
    (each once, in config order; a key at null is left out: it is off anyway)."""
    found: dict[str, None] = {}
    for choice in registry_choices(cfg):
        trait = choice.trait("inert_on_policy")
        if trait is True:
            found[f"{choice.key}={choice.value}"] = None
        elif trait:
            parent = choice.key.rpartition(".")[0]
            for name in trait:
                value = getattr(choice.section, name)
                if value is not None:
                    found[f"{parent}.{name}={f'{value:g}' if isinstance(value, float) else value}"] = None
    return list(found)


def needs_group(cfg: Any) -> str | None:
    """`key=value` of the first setting of the algorithm config `cfg` that needs several responses per prompt (with
    the setting that makes it so, where the entry names one), or None."""
    for choice in registry_choices(cfg):
        needs = choice.trait("needs_group")
        because = needs(choice.section) if callable(needs) else needs
        if because:
            return f"{choice.key}={choice.value}" + (f" ({because})" if isinstance(because, str) else "")
    return None

"""Registry: the one name -> function lookup of algorithm parts, rollout engines, data loaders and answer extractors."""

from __future__ import annotations

import pytest

from tokenpo.algorithms import ADVANTAGES
from tokenpo.data.loaders import LOADERS
from tokenpo.errors import ConfigError
from tokenpo.registry import Registry
from tokenpo.rewards.extract import ANSWER_PATTERNS, FALLBACKS
from tokenpo.rollout.engine import ENGINES


def test_registry_lists_known_names_for_an_unknown_one():
    registry = Registry("widget")
    registry.register("b")(len)
    registry.add("a", len, fast=True)
    with pytest.raises(ConfigError, match=r"^unknown widget 'c'; known: a, b$"):
        registry.get("c")
    assert registry.get("a") is len
    assert registry.trait("a", "fast") is True and registry.trait("b", "fast") is None
    with pytest.raises(ValueError, match="already registered"):
        registry.register("a")(len)


@pytest.mark.parametrize("registry, kind", [
    (ADVANTAGES, "advantage estimator"),
    (ENGINES, "rollout.engine"),
    (LOADERS, "data.loader"),
    (ANSWER_PATTERNS, "answer_pattern"),
    (FALLBACKS, "fallback"),
])
def test_every_lookup_is_a_registry_with_the_same_error(registry, kind):
    with pytest.raises(ConfigError, match=rf"^unknown {kind} 'nope'; known: {', '.join(registry.names())}$"):
        registry.get("nope")

"""Test helper: nested configs as flat {dotted key: value} dicts, for comparing configs key by key."""

from __future__ import annotations

import dataclasses


def flat(node: object, prefix: str = "") -> dict:
    """Nested dataclass/dict -> {"loss.clip_high": 0.28, ...}."""
    if dataclasses.is_dataclass(node):
        node = {f.name: getattr(node, f.name) for f in dataclasses.fields(node)}
    if not isinstance(node, dict):
        return {prefix: node}
    out = {}
    for key, value in node.items():
        out.update(flat(value, f"{prefix}.{key}" if prefix else key))
    return out

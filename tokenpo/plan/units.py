"""Byte counts as people write them: 80GiB, 80GB, 1.5e9 (bytes) and back."""

from __future__ import annotations

import re

from tokenpo.errors import ConfigError

UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
         "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_bytes(value: int | float | str, key: str) -> int:
    """An integer byte count from a number or a string such as '80GiB' or '1.5 TB' (one-line error naming `key`)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        number, unit = float(value), ""
    else:
        match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][0-9]+)?)\s*([a-zA-Z]*)\s*", str(value))
        if not match or match.group(2).lower() not in UNITS:
            raise ConfigError(f"{key} must be a byte count such as 85899345920, 80GiB or 80GB, got {value!r}")
        number, unit = float(match.group(1)), match.group(2).lower()
    if number <= 0:
        raise ConfigError(f"{key} must be > 0, got {value!r}")
    return int(number * UNITS[unit])


def format_bytes(count: int) -> str:
    """'12.34 GiB' (binary units, as device memory is quoted)."""
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(count) >= size:
            return f"{count / size:.2f} {unit}"
    return f"{count} B"

"""A reward for the GPU check's dynamic-sampling part (reward.fn=coin_reward:verdict): a drawn model never answers
right, so every group would be all-wrong and dynamic sampling would drop them all. This calls a quarter of the
responses right, by a hash of their text (crc32: the same in every reward worker, unlike Python's salted hash), so
groups of 8 come out mixed (P = 0.90) or all-wrong and some rounds drop groups."""

from __future__ import annotations

import zlib


def verdict(response: str, gold: str) -> bool:
    return zlib.crc32(response.encode()) % 4 == 0

"""A reward for the multi-process tests, imported by path ("trainer_rewards:even_length") in every process."""


def even_length(response: str, gold: str) -> bool:
    """True for an even number of characters: the random tiny model then gets groups with mixed rewards,
    so advantages, losses and parameter updates are non-zero (its answers are never correct)."""
    return len(response) % 2 == 0

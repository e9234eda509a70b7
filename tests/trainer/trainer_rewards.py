"""A reward for the multi-process tests, imported by path ("trainer_rewards:even_length") in every process."""


def even_length(response: str, gold: str) -> bool:
    """True for an even number of characters: the random tiny model then gets groups with mixed rewards,
    so advantages, losses and parameter updates are non-zero (its answers are never correct)."""
    return len(response) % 2 == 0


def length_credit(response: str, gold: str, prompt: str, fields: dict) -> float:
    """Partial credit for a reward.functions entry: the response's length over 100 characters, capped at 1 (every
    response of the random tiny model gets a different score)."""
    return min(1.0, len(response) / 100)


def errors_unless_boxed(response: str, gold: str, prompt: str, fields: dict) -> float:
    """Passes the start-up call (whose response answers in \\boxed{}) and raises on every response of the random
    tiny model, which never writes one: a reward function broken on real responses."""
    if "\\boxed{" not in response:
        raise ValueError("no boxed answer to read")
    return 1.0

"""Errors that stop a run at start-up with a one-line message instead of a traceback."""


class ConfigError(ValueError):
    """A config value is invalid; the message names the key, e.g. 'rollout.group_size must be >= 1, got -2'."""

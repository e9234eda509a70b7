"""Typed schema of the `logger` config group."""

from __future__ import annotations

from dataclasses import dataclass

from tokenpo.errors import ConfigError

MODES = ("auto", "online", "offline", "disabled")


@dataclass
class LoggerConfig:
    mode: str = "auto"
    project: str = "tokenpo"
    entity: str | None = None
    group: str | None = None
    name: str | None = None
    tags: tuple = ()
    console_every: int = 1
    samples_every: int = 10
    samples_rows: int = 32

    def validate(self) -> None:
        if self.mode not in MODES:
            raise ConfigError(f"logger.mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if self.console_every < 1:
            raise ConfigError(f"logger.console_every must be >= 1, got {self.console_every}")
        if not isinstance(self.samples_every, int) or self.samples_every < 0:
            raise ConfigError(f"logger.samples_every must be an integer >= 0 (0: no sample tables), "
                              f"got {self.samples_every!r}")
        if not isinstance(self.samples_rows, int) or self.samples_rows < 1:
            raise ConfigError(f"logger.samples_rows must be an integer >= 1, got {self.samples_rows!r}")

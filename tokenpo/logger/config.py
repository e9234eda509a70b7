"""Typed schema of the `logger` config group."""

from __future__ import annotations

from dataclasses import dataclass

from tokenpo.schema import check_fields, setting

MODES = ("auto", "online", "offline", "disabled")


@dataclass
class LoggerConfig:
    mode: str = setting("auto", "online | offline | disabled | auto (online with an API key, else offline)",
        choices=MODES)
    project: str = setting("tokenpo", "W&B project")
    entity: str | None = setting(None, "W&B entity (team or user; null = your default)")
    group: str | None = setting(None,
        "Run group (null = the multirun folder name, so a sweep is one group; a single run's group is its algorithm)")
    name: str | None = setting(None, 'Run name (null = derived from the Hydra overrides, e.g. "algorithm=dapo,seed=1")')
    tags: tuple = setting((), "Extra W&B tags")
    console_every: int = setting(1, "Console summary line every this many steps", ge=1)
    samples_every: int = setting(10,
        "Table of sampled training rollouts (prompt, response, reward, verdict, answer, length, truncated) every this "
        "many steps, and of each evaluation's responses at every eval; to W&B (samples/*) and <run_dir>/samples.jsonl; "
        "0 = off", ge=0, requirement="an integer >= 0 (0: no sample tables)")
    samples_rows: int = setting(32,
        "Rows per table at most (spread over problems: one response of each before a second of any)",
        ge=1, requirement="an integer >= 1")

    def validate(self) -> None:
        check_fields(self, "logger")

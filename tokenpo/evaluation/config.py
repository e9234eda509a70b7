"""Typed schema of the `eval` config group: which benchmark, which protocol, how often during training."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from tokenpo.errors import ConfigError
from tokenpo.schema import from_dict

# keys of the main benchmark that every eval.extra benchmark shares: evaluations happen together
SHARED_KEYS = ("every_steps", "before_training", "extra")


def data_keys(extra) -> list[str]:
    """The config key of the data section of eval and of each eval.extra entry (one without its own `data` has
    eval's): what errors in a benchmark's data name."""
    return ["eval.data", *(f"eval.extra[{i}].data" if isinstance(entry, dict) and "data" in entry else "eval.data"
                           for i, entry in enumerate(extra))]


@dataclass
class EvalConfig:
    name: str = "arith"
    every_steps: int = 10
    data: dict | None = None
    max_problems: int | None = 64
    greedy: bool = True
    n: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int | None = None
    pass_k: tuple = (1,)
    batch_size: int = 64
    before_training: bool = True
    extra: tuple = ()

    def benchmarks(self) -> list[EvalConfig]:
        """This benchmark, then each eval.extra entry: this config with the entry's keys replaced."""
        base = {key: value for key, value in asdict(self).items() if key != "extra"}
        return [self, *(from_dict(EvalConfig, {**base, **entry}, f"eval.extra[{i}]")
                        for i, entry in enumerate(self.extra))]

    def data_keys(self) -> list[str]:
        """The config key of each benchmark's data section, in benchmarks() order (for error messages)."""
        return data_keys(self.extra)

    def validate(self) -> None:
        names = [self.name]
        for i, entry in enumerate(self.extra):
            if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
                raise ConfigError(f"eval.extra[{i}] must be a mapping of eval keys with a name, got {entry!r}")
            shared = sorted(set(entry) & set(SHARED_KEYS))
            if shared:
                raise ConfigError(f"eval.extra[{i}] sets {', '.join(shared)}: extra benchmarks are evaluated "
                                  "with the main one, set it on eval")
            names.append(entry["name"])
        if len(set(names)) != len(names):
            raise ConfigError(f"eval.name and eval.extra names must differ (they name the metrics), got {names}")
        for i, extra in enumerate(self.benchmarks()[1:]):
            try:
                extra.validate()
            except ConfigError as err:
                raise ConfigError(f"eval.extra[{i}] ({extra.name}): {err}") from None
        if self.every_steps < 0:
            raise ConfigError(f"eval.every_steps must be >= 0, got {self.every_steps}")
        if self.n < 0:
            raise ConfigError(f"eval.n must be >= 0, got {self.n}")
        if not self.greedy and self.n == 0:
            raise ConfigError("eval.greedy is false and eval.n is 0: nothing would be evaluated")
        if self.max_problems is not None and self.max_problems < 1:
            raise ConfigError(f"eval.max_problems must be >= 1 or null, got {self.max_problems}")
        if self.max_new_tokens is not None and self.max_new_tokens < 1:
            raise ConfigError(f"eval.max_new_tokens must be >= 1 or null, got {self.max_new_tokens}")
        if self.temperature < 0 or not 0 < self.top_p <= 1:
            raise ConfigError(f"eval.temperature must be >= 0 and eval.top_p in (0, 1], got {self.temperature}, {self.top_p}")
        bad = [k for k in self.pass_k
               if isinstance(k, bool) or not isinstance(k, int) or k < 1 or (self.n and k > self.n)]
        if bad:
            raise ConfigError(
                f"eval.pass_k values must be whole numbers in [1, eval.n={self.n}], got {list(self.pass_k)}")
        if self.batch_size < 1:
            raise ConfigError(f"eval.batch_size must be >= 1, got {self.batch_size}")

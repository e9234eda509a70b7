"""Typed schema of the `eval` config group: which benchmark, which protocol, how often during training."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from tokenpo.errors import ConfigError
from tokenpo.schema import check_fields, from_dict, require, setting

# keys of the main benchmark that every eval.extra benchmark shares: evaluations happen together
SHARED_KEYS = ("every_steps", "before_training", "extra")


def data_keys(extra) -> list[str]:
    """The config key of the data section of eval and of each eval.extra entry (one without its own `data` has
    eval's): what errors in a benchmark's data name."""
    return ["eval.data", *(f"eval.extra[{i}].data" if isinstance(entry, dict) and "data" in entry else "eval.data"
                           for i, entry in enumerate(extra))]


@dataclass
class EvalConfig:
    name: str = setting("arith", "Benchmark name in metric keys (eval/<name>/<metric>)")
    every_steps: int = setting(10,
        "Steps between held-out evaluations during training (0 = only before and after training)", ge=0)
    data: dict | None = setting(None,
        "The benchmark's data config (same schema as the `data` group); null = the training data's eval split")
    max_problems: int | None = setting(64, "Problems evaluated (the first N; null = all)",
        ge=1, requirement=">= 1 or null")
    greedy: bool = setting(True, "Greedy decoding accuracy (the main job's before/after number)")
    n: int = setting(0, "Samples per problem for mean@n, pass@k and maj@n (0 = greedy only)", ge=0)
    temperature: float = setting(1.0, "Sampling temperature of the n samples", ge=0)
    top_p: float = setting(1.0, "Nucleus mass of the n samples", gt=0, le=1)
    max_new_tokens: int | None = setting(None, "Maximum response tokens (null = rollout.max_new_tokens)",
        ge=1, requirement=">= 1 or null")
    pass_k: tuple = setting((1,), "k values of pass@k (each <= n)")
    batch_size: int = setting(64, "Responses generated per forward batch (memory knob)", ge=1)
    before_training: bool = setting(True,
        "Evaluate before the first step as well (verl's val_before_train); the untrained model's score is step 0 of the"
        " curves")
    final_only: bool = setting(False,
        "Evaluate only after the last step (an eval.extra benchmark needed only at the end; false on the main one)")
    extra: tuple = setting((),
        "Further benchmarks evaluated at the same steps, each a mapping of the eval keys it changes from this one, name"
        " required (metrics eval/<name>/...; records eval_after.<name>.json)")

    def benchmarks(self) -> list[EvalConfig]:
        """This benchmark, then each eval.extra entry: this config with the entry's keys replaced."""
        base = {key: value for key, value in asdict(self).items() if key != "extra"}
        return [self, *(from_dict(EvalConfig, {**base, **entry}, f"eval.extra[{i}]")
                        for i, entry in enumerate(self.extra))]

    def data_keys(self) -> list[str]:
        """The config key of each benchmark's data section, in benchmarks() order (for error messages)."""
        return data_keys(self.extra)

    def validate(self, main: bool = True) -> None:
        """`main`: this is eval itself, not an eval.extra entry (only an extra one may be final_only)."""
        check_fields(self, "eval")
        names = [self.name]
        for i, entry in enumerate(self.extra):
            require(isinstance(entry, dict) and isinstance(entry.get("name"), str),
                    f"eval.extra[{i}] must be a mapping of eval keys with a name, got {entry!r}")
            shared = sorted(set(entry) & set(SHARED_KEYS))
            require(not shared, f"eval.extra[{i}] sets {', '.join(shared)}: extra benchmarks are evaluated with "
                                "the main one, set it on eval")
            names.append(entry["name"])
        require(len(set(names)) == len(names),
                f"eval.name and eval.extra names must differ (they name the metrics), got {names}")
        for i, extra in enumerate(self.benchmarks()[1:]):
            try:
                extra.validate(main=False)
            except ConfigError as err:
                raise ConfigError(f"eval.extra[{i}] ({extra.name}): {err}") from None
        require(not (main and self.final_only), "eval.final_only is for an eval.extra benchmark: the main one is evaluated at every"
                                     " point (set eval.every_steps=0 and eval.before_training=false instead)")
        require(self.greedy or self.n > 0, "eval.greedy is false and eval.n is 0: nothing would be evaluated")
        bad = [k for k in self.pass_k
               if isinstance(k, bool) or not isinstance(k, int) or k < 1 or (self.n and k > self.n)]
        require(not bad, f"eval.pass_k values must be whole numbers in [1, eval.n={self.n}], got {list(self.pass_k)}")

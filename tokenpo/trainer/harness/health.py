"""Runs that watch themselves (`trainer.health.*`, docs/reliability.md): per-step detectors, each with an action.

- `constant_reward` (`reward/correct_frac`): every response got the same verdict (all wrong, or all right),
  `steps` steps in a row;
- `nonfinite` (the loss and the gradients, at each optimizer update): one is NaN or infinite;
- `ratio` (`kl/old`): above `max_kl_old`, `steps` steps in a row;
- `sampler_kl` (`mismatch/kl`, only where the engine returns log-probs): above `max_kl`, `steps` steps in a row;
- `entropy` (`entropy/mean`): below `collapse_frac` or above `blowup_factor` times its mean over the run's first
  `reference_steps` steps, `steps` steps in a row;
- `reward_errors` (`reward/error_frac`): above `max_error_frac` (every reward an error: a broken reward function),
  `steps` steps in a row; by default it stops the run. Its metric is the rollouts', known before the update, which
  it never holds: an all-error step's update changes nothing the rewards asked for.

A detector whose metric a step lacks leaves that step out (its count neither grows nor resets). Each one logs
`health/<detector>_fired` (0/1) every step; a streak fires at its `steps`-th step and at every step after while
the condition holds, and says so in one log line (and a W&B alert) at its first. Actions: `warn`; `skip`: this
step's last optimizer update (with one mini-batch, its only one) is not applied; `stop`: as skip, then a checkpoint
and a one-line error that names the detector and the key to change. `health/skipped_updates` counts the updates
not applied, over the whole run.

`UpdateGuard` stands between the policy's gradients and its weights (`Policy.step`): a non-finite loss (on any
process) or gradient is never applied, whatever the config. It wraps the step of the torch optimizer inside the
DeepSpeed engine, the call that changes the weights under every ZeRO stage, so DeepSpeed's own bookkeeping
(gradient reduction, clipping, zeroing the gradients) runs as usual. Where a detector may skip or stop, the step's
last update is held (`Policy.step` returns before `engine.step()`) until `HealthMonitor.check` has read the step's
metrics, which every process computes alike; any pass that reads the weights first applies it.

`python -m tokenpo.trainer.harness.health <metrics.jsonl> [key=value ...]` replays a run's logged metrics through the
detectors (the default config, or `entropy.collapse_frac=0.05`-style overrides) and prints which would fire.
"""

from __future__ import annotations

import logging
import math
import sys
from collections.abc import Callable, Iterable
from typing import Protocol
from dataclasses import dataclass

from tokenpo.errors import ConfigError
from tokenpo.trainer.config import DETECTORS, HealthConfig

log = logging.getLogger("tokenpo")

SKIPPED_UPDATES = "health/skipped_updates"
CORRECT_FRAC = "reward/correct_frac"


def fired_key(name: str) -> str:
    return f"health/{name}_fired"


class HealthStop(ConfigError):
    """A detector with action=stop fired: the run saved a checkpoint and ends with this one line (a ConfigError, so
    every entry point prints it as `tokenpo: error: ...` and exits with status 2)."""


@dataclass(frozen=True)
class Firing:
    """A detector that fired at a step: what it saw, in words."""

    detector: str
    action: str
    reason: str
    first: bool  # the first step of its streak (the one that logs and alerts)
    off_key: str | None = None  # the key of trainer.health.<detector> that turns it off (null)

    def line(self, step: int) -> str:
        return (f"health: {self.detector} at step {step}: {self.reason} (action {self.action}; "
                f"trainer.health.{self.detector})")


def _value(metrics: dict, key: str) -> float | None:
    value = metrics.get(key)
    return None if value is None else float(value)


# --- the detectors: pure logic on one step's metrics, their state a small dict ---

class ConstantReward:
    """Every response of the step judged the same (reward/correct_frac exactly 0 or 1), `steps` steps in a row with
    the same value."""

    name = "constant_reward"
    off_key = "steps"

    def __init__(self, steps: int | None) -> None:
        self.steps = steps
        self.streak, self.last = 0, None

    def observe(self, metrics: dict) -> tuple[bool, str] | None:
        value = _value(metrics, CORRECT_FRAC)
        if self.steps is None or value is None:
            return None
        if value in (0.0, 1.0):
            self.streak = self.streak + 1 if value == self.last else 1
            self.last = value
        else:
            self.streak, self.last = 0, None
        verdict = "wrong" if value == 0.0 else "right"
        return self.streak >= self.steps, (f"every response judged {verdict} ({CORRECT_FRAC} {value:g}) for "
                                           f"{self.streak} steps in a row")

    def state_dict(self) -> dict:
        return {"streak": self.streak, "last": self.last}

    def load_state_dict(self, state: dict) -> None:
        self.streak, self.last = int(state["streak"]), state["last"]


class Bound:
    """A metric above `bound`, `steps` steps in a row (bound None: off)."""

    def __init__(self, name: str, key: str, bound: float | None, steps: int, off_key: str) -> None:
        self.name, self.key, self.bound, self.steps, self.off_key = name, key, bound, steps, off_key
        self.streak = 0

    def observe(self, metrics: dict) -> tuple[bool, str] | None:
        value = _value(metrics, self.key)
        if self.bound is None or value is None:
            return None
        self.streak = self.streak + 1 if value > self.bound else 0
        return self.streak >= self.steps, (f"{self.key} {value:.4g} above {self.bound:g} for {self.streak} step(s) "
                                           f"in a row")

    def state_dict(self) -> dict:
        return {"streak": self.streak}

    def load_state_dict(self, state: dict) -> None:
        self.streak = int(state["streak"])


class Entropy:
    """entropy/mean below `collapse_frac` or above `blowup_factor` times its mean over the run's first
    `reference_steps` steps (the steps after those are checked), `steps` steps in a row."""

    name = "entropy"
    key = "entropy/mean"

    def __init__(self, reference_steps: int, collapse_frac: float | None, blowup_factor: float | None,
                 steps: int) -> None:
        self.reference_steps, self.collapse_frac, self.blowup_factor, self.steps = (
            reference_steps, collapse_frac, blowup_factor, steps)
        self.seen: list[float] = []  # the first steps' values, until the reference is made of them
        self.reference: float | None = None
        self.streak = 0
        self.off_key = "collapse_frac"  # the bound the last firing crossed

    def observe(self, metrics: dict) -> tuple[bool, str] | None:
        value = _value(metrics, self.key)
        if value is None or not math.isfinite(value) or (self.collapse_frac is None and self.blowup_factor is None):
            return None
        if self.reference is None:
            self.seen.append(value)
            if len(self.seen) >= self.reference_steps:
                self.reference = sum(self.seen) / len(self.seen)
            return None
        low = self.collapse_frac is not None and value < self.collapse_frac * self.reference
        high = self.blowup_factor is not None and value > self.blowup_factor * self.reference
        self.streak = self.streak + 1 if low or high else 0
        self.off_key = "collapse_frac" if low else "blowup_factor"
        where = (f"below {self.collapse_frac:g} x" if low else f"above {self.blowup_factor:g} x")
        return self.streak >= self.steps, (f"{self.key} {value:.4g} {where} its start {self.reference:.4g} (mean of "
                                           f"the first {len(self.seen)} steps) for {self.streak} step(s) in a row")

    def state_dict(self) -> dict:
        return {"seen": list(self.seen), "reference": self.reference, "streak": self.streak}

    def load_state_dict(self, state: dict) -> None:
        self.seen, self.reference, self.streak = [float(v) for v in state["seen"]], state["reference"], \
            int(state["streak"])


class NonFinite:
    """A non-finite loss or gradient: the updates `UpdateGuard` kept from the weights this step (`nonfinite`), or,
    replaying a metrics.jsonl, a logged loss or grad_norm that is not finite (stored there as null)."""

    name = "nonfinite"
    off_key = None  # a non-finite update is never applied

    def observe(self, metrics: dict, nonfinite: int = 0) -> tuple[bool, str] | None:
        bad = [key for key in ("loss", "grad_norm")
               if key in metrics and (metrics[key] is None or not math.isfinite(float(metrics[key])))]
        if nonfinite:
            return True, (f"{nonfinite} update(s) with a non-finite loss or gradient, not applied"
                          + (f" ({', '.join(bad)} not finite)" if bad else ""))
        return bool(bad), f"{', '.join(bad)} not finite"

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


def build_detectors(cfg: HealthConfig) -> dict:
    """The detectors of `cfg`, by name (in DETECTORS order)."""
    return {
        "constant_reward": ConstantReward(cfg.constant_reward.steps),
        "nonfinite": NonFinite(),
        "ratio": Bound("ratio", "kl/old", cfg.ratio.max_kl_old, cfg.ratio.steps, "max_kl_old"),
        "sampler_kl": Bound("sampler_kl", "mismatch/kl", cfg.sampler_kl.max_kl, cfg.sampler_kl.steps, "max_kl"),
        "entropy": Entropy(cfg.entropy.reference_steps, cfg.entropy.collapse_frac, cfg.entropy.blowup_factor,
                           cfg.entropy.steps),
        "reward_errors": Bound("reward_errors", "reward/error_frac", cfg.reward_errors.max_error_frac,
                               cfg.reward_errors.steps, "max_error_frac"),
    }


class Detectors:
    """The detectors of a config and the run's count of skipped updates: one step's metrics in, the firings
    out. Pure: the live run (`HealthMonitor`) and the replay of a metrics.jsonl (`replay`) share it."""

    def __init__(self, cfg: HealthConfig, state: dict | None = None) -> None:
        self.cfg = cfg
        self.detectors = build_detectors(cfg)
        self.skipped_updates = 0
        self.was_firing = {name: False for name in DETECTORS}
        if state:
            self.load_state_dict(state)

    def action(self, name: str) -> str:
        return getattr(self.cfg, name).action

    def observe(self, metrics: dict, names: Iterable[str] = DETECTORS, nonfinite: int = 0) -> list[Firing]:
        """The detectors among `names` that fire on this step's `metrics`; `nonfinite`: the updates UpdateGuard kept
        from the weights this step for a non-finite loss or gradient."""
        firings = []
        for name in names:
            detector = self.detectors[name]
            seen = detector.observe(metrics, nonfinite) if name == "nonfinite" else detector.observe(metrics)
            if seen is None:  # the step lacks its metric, or it is off
                continue
            fired, reason = seen
            if fired:
                # a non-finite update is an event of its own each time; a streak logs once, at its first step
                first = name == "nonfinite" or not self.was_firing[name]
                firings.append(Firing(name, self.action(name), reason, first, detector.off_key))
            self.was_firing[name] = fired
        return firings

    def metrics(self, firings: list[Firing]) -> dict[str, float]:
        fired = {firing.detector for firing in firings}
        out = {fired_key(name): float(name in fired) for name in DETECTORS}
        out[SKIPPED_UPDATES] = float(self.skipped_updates)
        return out

    def state_dict(self) -> dict:
        return {"detectors": {name: d.state_dict() for name, d in self.detectors.items()},
                "firing": dict(self.was_firing), "skipped_updates": self.skipped_updates}

    def load_state_dict(self, state: dict) -> None:
        for name, detector_state in state.get("detectors", {}).items():
            if name in self.detectors:
                self.detectors[name].load_state_dict(detector_state)
        self.was_firing.update({k: bool(v) for k, v in state.get("firing", {}).items() if k in self.was_firing})
        self.skipped_updates = int(state.get("skipped_updates", 0))


# --- the live run ---

class PendingUpdate(Protocol):
    """What the checks read of the policy (tokenpo.trainer.core.policy.Policy): its update held for them, committed or
    skipped, the updates skipped, the last update's gradient norm."""

    def commit(self, veto: bool) -> bool: ...

    def skipped_updates(self) -> tuple[int, int]: ...

    def grad_norm(self) -> float: ...


class HealthMonitor:
    """The run's detectors on each step's metrics (`check`, called by the step before the generator takes the new
    weights), W&B alerts through `alert(title, text, stop)`, and the firing that stops the run (`stopping`). `state`:
    RunState.health from a checkpoint."""

    def __init__(self, cfg: HealthConfig, state: dict | None = None,
                 alert: Callable[[str, str, bool], None] | None = None) -> None:
        self.detectors = Detectors(cfg, state)
        self.alert = alert
        self.stopping: Firing | None = None
        self.stop_step = 0

    def check(self, step: int, metrics: dict, policy: PendingUpdate) -> dict[str, float]:
        """This step's health metrics, from its `metrics` (the same on every process); the policy's update held for
        them committed or skipped here (the gradient norm then read again: that update's)."""
        # the metric detectors, then the held update, then the non-finite ones (the update counts there)
        firings = self.detectors.observe(metrics, [name for name in DETECTORS if name != "nonfinite"])
        if policy.commit(veto=any(f.action in ("skip", "stop") for f in firings)):
            metrics["grad_norm"] = policy.grad_norm()
        skipped, nonfinite = policy.skipped_updates()
        self.detectors.skipped_updates += skipped
        firings += self.detectors.observe(metrics, ["nonfinite"], nonfinite)
        for firing in firings:
            if firing.first and self.alert is not None:
                self.alert(f"tokenpo health: {firing.detector}", firing.line(step), firing.action == "stop")
            if firing.action == "stop" and self.stopping is None:
                self.stopping, self.stop_step = firing, step
        return self.detectors.metrics(firings)

    def state_dict(self) -> dict:
        return self.detectors.state_dict()

    def stop_error(self, run_dir) -> HealthStop:
        """The one line the run ends with after the checkpoint of the step that stopped it."""
        name, firing = self.stopping.detector, self.stopping
        if name == "nonfinite":
            change = "trainer.health.nonfinite.action=skip (skip such updates)"
        else:
            change = (f"trainer.health.{name}.action=warn (a warning only) or trainer.health.{name}.{firing.off_key}"
                      "=null (off)")
        return HealthStop(f"trainer.health.{name} stopped the run at step {self.stop_step}: {firing.reason}; "
                          f"checkpoint saved in {run_dir}/checkpoints: the same command with {change} resumes from it")



# --- replay: which detectors a logged run would have fired ---

def replay(rows: Iterable[dict], cfg: HealthConfig | None = None) -> list[tuple[int, Firing]]:
    """(step, firing) for every step of `rows` (metrics.jsonl records, in order) at which a detector of `cfg`
    (default: the shipped config) fires."""
    detectors = Detectors(cfg or HealthConfig())
    return [(int(row["step"]), firing) for row in rows for firing in detectors.observe(row)]


def config_with(overrides: list[str]) -> HealthConfig:
    """The shipped health config with `detector.key=value` overrides (a `trainer.health.` prefix is allowed)."""
    import yaml

    from tokenpo.schema import build

    values: dict = {}
    for override in overrides:
        key, sep, text = override.partition("=")
        if not sep:
            raise ConfigError(f"{override!r}: expected detector.key=value, e.g. entropy.collapse_frac=0.05")
        *path, leaf = key.removeprefix("trainer.health.").split(".")
        node = values
        for part in path:
            node = node.setdefault(part, {})
        node[leaf] = yaml.safe_load(text)
    return build(HealthConfig, values, "trainer.health")


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: python -m tokenpo.trainer.harness.health <metrics.jsonl> [detector.key=value ...]\n"
              "Replays a run's logged metrics through the health detectors (trainer.health, the shipped defaults "
              "unless overridden) and prints each step at which one would fire.")
        return 0 if argv else 2
    from pathlib import Path

    from tokenpo.logger.run_logger import read_rows

    path = Path(argv[0])
    try:
        cfg = config_with(argv[1:])
    except ConfigError as err:
        print(f"tokenpo: error: {err}", file=sys.stderr)
        return 2
    rows = [row for row in read_rows(path) if "step" in row]
    firings = replay(rows, cfg)
    for step, firing in firings:
        print(f"step {step}: {firing.detector} fires (action {firing.action}): {firing.reason}")
    steps = sum(1 for row in rows if row["step"] > 0)
    print(f"{path}: {len(firings)} firing(s) in {steps} training steps; "
          + ", ".join(f"{name} {sum(1 for _, f in firings if f.detector == name)}" for name in DETECTORS))
    return 1 if firings else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Time tokenpo's RL steps through the real trainer: tokenpo.trainer.harness.loop.train on a composed config.

The phases come from the trainer's own metrics.jsonl (timing/*_s). The update is split further by timing
the DeepSpeed engine's backward() and step() from outside: the trainer modules' references to
`build_policy_engine` (tokenpo.trainer.core.policy), `collect_rollouts` and `update_policy` (tokenpo.trainer.core.step) are
wrapped for the duration of the run, nothing is edited.
"""

from __future__ import annotations

import contextlib
import json
import tempfile
import time
from pathlib import Path

from tokenpo.bench.settings import BenchSettings, train_config
from tokenpo.bench.stats import AHEAD_PHASES, model_shape

# metrics.jsonl key -> bench phase; a pass the run did not need (no reference at beta = 0) took 0 s
METRIC_PHASES = {"generate": "timing/generate_s", "reward": "timing/reward_s", "reference": "timing/reference_s",
                 "old_logprob": "timing/old_logprob_s", "update": "timing/update_s",
                 "weight_sync": "timing/weight_sync_s"}


def timed(fn, totals: dict, key: str):
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            totals[key] += time.perf_counter() - start

    return wrapper


@contextlib.contextmanager
def instrumented_trainer(per_step: list[dict], shape: dict):
    """Within: each step appends its backward/optimizer seconds, the process's CPU seconds (all threads; on a
    busy machine the steadier measure at one thread) and token counts to `per_step`."""
    from tokenpo.trainer.core import policy
    from tokenpo.trainer.core import step

    build_engine, collect, update = policy.build_policy_engine, step.collect_rollouts, step.update_policy
    totals = {"backward": 0.0, "optimizer": 0.0}
    cpu_start = {}

    def build_policy_engine(model, *args, **kwargs):
        shape.update(model_shape(model))
        engine = build_engine(model, *args, **kwargs)
        engine.backward = timed(engine.backward, totals, "backward")
        engine.step = timed(engine.step, totals, "optimizer")
        return engine

    def collect_rollouts(*args, **kwargs):
        cpu_start["step"] = time.process_time()
        return collect(*args, **kwargs)

    def update_policy(run, trained, rollouts, *rest):
        totals.update(backward=0.0, optimizer=0.0)
        result = update(run, trained, rollouts, *rest)
        per_step.append({**totals, "step_cpu_s": time.process_time() - cpu_start["step"],
                         "completion_tokens": int(rollouts.lengths.sum()),
                         "prompt_tokens": int(rollouts.prompt_lengths.sum())})
        return result

    patched = {(policy, "build_policy_engine"): build_policy_engine, (step, "collect_rollouts"): collect_rollouts,
               (step, "update_policy"): update_policy}
    originals = {(module, name): getattr(module, name) for module, name in patched}
    for (module, name), fn in patched.items():
        setattr(module, name, fn)
    try:
        yield
    finally:
        for (module, name), fn in originals.items():
            setattr(module, name, fn)


def run_tokenpo(s: BenchSettings) -> dict:
    """{"steps": [per-step seconds and token counts], "shape": model shape} of `s.steps` tokenpo steps."""
    from tokenpo.trainer import RunIdentity
    from tokenpo.trainer import train

    cfg, resolved = train_config(s)
    extra, shape = [], {}
    with tempfile.TemporaryDirectory(prefix="tokenpo-bench-") as run_dir:
        with instrumented_trainer(extra, shape):
            train(cfg, RunIdentity(Path(run_dir), "bench", "bench", resolved))
        lines = (Path(run_dir) / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    steps = []
    for record, split in zip(records, extra, strict=True):
        step = {phase: record.get(key) or 0.0 for phase, key in METRIC_PHASES.items()}
        step["step_s"] = record["timing/step_s"]
        step.update({phase: record[f"timing/{phase}_s"] for phase in AHEAD_PHASES if f"timing/{phase}_s" in record})
        step.update(split)
        step["policy_forward"] = step["update"] - split["backward"] - split["optimizer"]
        steps.append(step)
    return {"steps": steps, "shape": shape}

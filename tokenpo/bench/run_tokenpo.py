"""Time tokenpo's RL steps through the real trainer: tokenpo.trainer.loop.train on a composed config.

The phases come from the trainer's own metrics.jsonl (timing/*_s). The update is split further by timing
the DeepSpeed engine's backward() and step() from outside: the trainer module's references to
`build_policy_engine` and `train_on_rollouts` are wrapped for the duration of the run, nothing is edited.
"""

from __future__ import annotations

import contextlib
import json
import tempfile
import time
from pathlib import Path

from tokenpo.bench.settings import BenchSettings, train_config
from tokenpo.bench.stats import model_shape

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
    from tokenpo.trainer import loop

    build_engine, collect, train_step = loop.build_policy_engine, loop.collect_rollouts, loop.train_on_rollouts
    totals = {"backward": 0.0, "optimizer": 0.0}
    cpu_start = {}

    def build_policy_engine(model, *args, **kwargs):
        shape.update(model_shape(model))
        engine = build_engine(model, *args, **kwargs)
        engine.backward = timed(engine.backward, totals, "backward")
        engine.step = timed(engine.step, totals, "optimizer")
        return engine

    def collect_rollouts(ctx, step):
        cpu_start["step"] = time.process_time()
        return collect(ctx, step)

    def train_on_rollouts(ctx, rollouts, timings):
        totals.update(backward=0.0, optimizer=0.0)
        metrics = train_step(ctx, rollouts, timings)
        per_step.append({**totals, "step_cpu_s": time.process_time() - cpu_start["step"],
                         "completion_tokens": sum(len(r) for r in rollouts.response_ids),
                         "prompt_tokens": sum(len(p) for p in rollouts.prompt_ids)})
        return metrics

    patched = {"build_policy_engine": build_policy_engine, "collect_rollouts": collect_rollouts,
               "train_on_rollouts": train_on_rollouts}
    originals = {name: getattr(loop, name) for name in patched}
    for name, fn in patched.items():
        setattr(loop, name, fn)
    try:
        yield
    finally:
        for name, fn in originals.items():
            setattr(loop, name, fn)


def run_tokenpo(s: BenchSettings) -> dict:
    """{"steps": [per-step seconds and token counts], "shape": model shape} of `s.steps` tokenpo steps."""
    from tokenpo.trainer.loop import train

    cfg, resolved = train_config(s)
    extra, shape = [], {}
    with tempfile.TemporaryDirectory(prefix="tokenpo-bench-") as run_dir:
        with instrumented_trainer(extra, shape):
            train(cfg, Path(run_dir), "bench", "bench", resolved)
        lines = (Path(run_dir) / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    steps = []
    for record, split in zip(records, extra, strict=True):
        step = {phase: record.get(key) or 0.0 for phase, key in METRIC_PHASES.items()}
        step["step_s"] = record["timing/step_s"]
        step.update(split)
        step["policy_forward"] = step["update"] - split["backward"] - split["optimizer"]
        steps.append(step)
    return {"steps": steps, "shape": shape}

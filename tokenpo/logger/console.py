"""What the console and summary.json say first: the run's header (algorithm, seed, model, parameters trained / total,
LoRA, batch, checkpoints), each step's line (step k/N, time left, the metrics a researcher reads) and the run's
outcome (final reward, correctness and tokens)."""

from __future__ import annotations

import math
from dataclasses import dataclass

# (metric, label) on each step's line; docs/metrics.md defines each (the unshaped correctness of every drawn response
# first: the one figure no algorithm shapes or filters)
CONSOLE_KEYS = (("accuracy/drawn", "acc"), ("reward/mean", "reward(shaped)"), ("entropy/mean", "entropy"),
                ("response_length/mean", "len"), ("loss", "loss"), ("kl/ref", "kl_ref"),
                ("timing/step_s", "s/step"), ("eval/accuracy", "eval_acc"))
# the last step's metrics summary.json carries
OUTCOME_KEYS = ("accuracy/drawn", "reward/mean", "accuracy", "tokens/generated_total", "eval/accuracy")


@dataclass(frozen=True)
class Parameters:
    total: int
    trained: int


def parameter_counts(module) -> Parameters:
    """The module's parameters and those that train (requires_grad); a ZeRO-3 partition counts whole (ds_numel)."""
    total = trained = 0
    for parameter in module.parameters():
        count = int(getattr(parameter, "ds_numel", 0) or parameter.numel())
        total += count
        trained += count if parameter.requires_grad else 0
    return Parameters(total, trained)


def millions(count: int) -> str:
    return f"{count / 1e6:.2f}M" if count >= 10_000 else f"{count:,}"


def run_header(config: dict, parameters: Parameters) -> str:
    """One line: what trains, on what, how long, and whether it can be resumed (`config`: the resolved run config)."""
    algorithm, model, trainer = config["algorithm"], config["model"], config["trainer"]
    rank = (model.get("lora") or {}).get("rank", 0)
    share = 100 * parameters.trained / max(1, parameters.total)
    trained = (f"LoRA rank {rank}: {millions(parameters.trained)} of {millions(parameters.total)} parameters trained "
               f"({share:.2g} %)" if rank else
               f"{millions(parameters.total)} parameters, all trained (full fine-tuning)")
    every = trainer["save_every"]
    checkpoints = (f"a checkpoint every {every} steps (trainer.save_every)" if every else
                   "no checkpoint unless a signal stops it (trainer.save_every=N saves one every N steps)")
    return (f"run: {algorithm['name']}, seed {config['seed']}; model {model['name']}: {trained}; "
            f"{trainer['max_steps']} steps of {config['data']['prompts_per_step']} prompts x "
            f"{config['rollout']['group_size']} responses; {checkpoints}")


def duration(seconds: float) -> str:
    seconds = max(0, round(seconds))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}h{rest // 60:02d}m" if hours else f"{rest // 60}m{rest % 60:02d}s"


def step_line(step: int, max_steps: int | None, metrics: dict) -> str:
    """`step k/N | acc ... | ... | left ~1m20s` (time left: the training seconds so far per step, times the steps to
    go)."""
    parts = [f"{label} {metrics[key]:.3g}" for key, label in CONSOLE_KEYS if key in metrics]
    head = f"step {step}/{max_steps}" if max_steps else f"step {step}"
    elapsed = metrics.get("time/elapsed_s")
    if max_steps and step and elapsed is not None and math.isfinite(elapsed) and step < max_steps:
        parts.append(f"left ~{duration(elapsed / step * (max_steps - step))}")
    return " | ".join([head, *parts])


def final_values(metrics: dict) -> dict:
    """The last step's values summary.json carries, under `final_<key>` (those the step logged)."""
    return {f"final_{key}": metrics[key] for key in OUTCOME_KEYS if metrics.get(key) is not None}

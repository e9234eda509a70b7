"""`python -m tokenpo.plan <the overrides of tokenpo.train>`: will this run fit in memory, per process?

    python -m tokenpo.plan experiment=paper/gtpo_qwen2_5_7b --device-memory 80GiB
    python -m tokenpo.plan model=tiny rollout.max_new_tokens=512 --json
    python -m tokenpo.plan --device cpu --prompt-tokens data      # the main job, planned from its data's prompts
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from hydra import initialize_config_dir

from tokenpo import CONF_DIR
from tokenpo.config import TrainConfig
from tokenpo.errors import ConfigError
from tokenpo.plan.context import run_prompt_lengths
from tokenpo.plan.memory import MemoryPlan, build_plan, cuda_memory
from tokenpo.plan.units import format_bytes, parse_bytes
from tokenpo.preflight import check_command_line, compose_and_validate


def compose_train_config(overrides: list[str]) -> TrainConfig:
    """The config tokenpo.train would run with these overrides (its command-line checks, one-line errors)."""
    check_command_line(CONF_DIR, "train", overrides)
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose_and_validate("train", overrides)


def run_world_size(cfg: TrainConfig) -> int:
    """Processes of the run: trainer.nproc local workers on each node, or an external launcher's WORLD_SIZE."""
    local = cfg.trainer.nproc * getattr(cfg.trainer, "nodes", 1)
    return max(local, int(os.environ.get("WORLD_SIZE", "1")))


def describe(plan: MemoryPlan, cfg: TrainConfig) -> str:
    shapes, deepspeed = plan.shapes, cfg.deepspeed
    lines = [
        f"memory plan per process: {cfg.model.name}, {plan.params:,} parameters ({plan.trainable_params:,} trained; "
        f"{plan.architecture_source}); {shapes.world} process(es), ZeRO {deepspeed.stage}, {deepspeed.precision}",
        f"shapes: prompt {shapes.prompt_tokens} + response {shapes.new_tokens} tokens; {shapes.rollout_rows} "
        f"sequences generated at once; largest micro-batch {shapes.micro_rows} sequences ({shapes.micro_groups} "
        "prompt(s))",
    ]
    width = max(len(part.name) for part in plan.parts)
    for part in plan.parts:
        host = f" (+{format_bytes(part.host_bytes)} host)" if part.host_bytes else ""
        lines.append(f"  {part.name:<{width}}  {format_bytes(part.bytes):>11}  {part.phase:<10}  {part.note}{host}")
    verdict = ""
    if plan.device_memory is not None:
        verdict = (f" of {format_bytes(plan.device_memory)} device memory: "
                   + ("fits" if plan.fits else "DOES NOT FIT"))
    lines.append(f"total {format_bytes(plan.total_bytes)} ({plan.total_bytes} bytes) at the {plan.peak_phase} "
                 f"phase's peak{verdict}")
    if plan.fits is False:
        if plan.suggestions:
            first, *others = plan.suggestions
            lines.append(f"suggested change: {first.change} (total {format_bytes(first.total_bytes)})")
            lines += [f"  or {other.change} (total {format_bytes(other.total_bytes)})" for other in others]
        else:
            lines.append("no single listed change fits: more processes (ZeRO-3 shards by the process count), "
                         "shorter sequences or a smaller model")
    return "\n".join(lines)


def prompt_tokens_arg(value: str) -> int | str:
    if value == "data":
        return value
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a token count or 'data', got {value!r}") from None


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tokenpo.plan", description=__doc__.splitlines()[0])
    parser.add_argument("overrides", nargs="*", help="the overrides of tokenpo.train (key=value, group=option)")
    parser.add_argument("--json", action="store_true", help="print one JSON object (total_bytes, parts)")
    parser.add_argument("--device-memory", help="memory of one device, e.g. 80GiB (default: the CUDA device's)")
    parser.add_argument("--world-size", type=int, help="processes in all (default: trainer.nproc, or WORLD_SIZE)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="what the processes run on (only the runtime part differs; default: cuda)")
    parser.add_argument("--prompt-tokens", type=prompt_tokens_arg,
                        help="longest prompt in tokens, or 'data': the longest of the run's data under its template, "
                             "counted by the model's tokenizer, as tokenpo.train plans at start-up (default: "
                             "data.max_prompt_tokens, else 512)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        cfg = compose_train_config(args.overrides)
        device_memory = parse_bytes(args.device_memory, "--device-memory") if args.device_memory else cuda_memory()
        world = args.world_size or run_world_size(cfg)
        if world < 1:
            raise ConfigError(f"--world-size must be >= 1, got {world}")
        prompt_tokens = run_prompt_lengths(cfg).train if args.prompt_tokens == "data" else args.prompt_tokens
        plan = build_plan(cfg, world, device_memory, prompt_tokens, device=args.device)
    except ConfigError as err:
        print(f"tokenpo.plan: error: {err}", file=sys.stderr)
        sys.exit(2)
    print(json.dumps(plan.as_json(), indent=1) if args.json else describe(plan, cfg))

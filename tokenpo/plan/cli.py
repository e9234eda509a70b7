"""`tokenpo-plan` / `python -m tokenpo.plan <the overrides of tokenpo.train>`: will this run fit in memory, per
process, as it would start here?

    tokenpo-plan                                                   # the main job, on this machine
    tokenpo-plan model=qwen2_5_math_1_5b rollout=vllm              # on this machine's GPU, with vLLM's headroom
    tokenpo-plan experiment=paper/gtpo_qwen2_5_7b --device cuda --device-memory 80GiB
    tokenpo-plan model=tiny rollout.max_new_tokens=512 --json

By default it plans what start-up plans: the device this machine has (CUDA where torch finds one, else the CPU) and
its memory (trainer.memory_limit where set, else the GPU's memory, or the RAM on CPU), the processes of the run and the
longest prompt of the run's data under its template, counted by the model's tokenizer; each can be overridden.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

from hydra import initialize_config_dir

from tokenpo import CONF_DIR
from tokenpo.errors import ConfigError
from tokenpo.plan.context import run_prompt_lengths
from tokenpo.plan.memory import DEFAULT_PROMPT_TOKENS, MemoryPlan, build_plan, cuda_memory, device_type, host_memory
from tokenpo.plan import parts as P
from tokenpo.plan.servers import ON_CPU, ON_GPUS
from tokenpo.plan.units import format_bytes, parse_bytes
from tokenpo.progress import quiet_library_bars

if TYPE_CHECKING:
    from tokenpo.config import TrainConfig


def compose_train_config(overrides: list[str]) -> TrainConfig:
    """The config tokenpo.train would run with these overrides (its command-line checks, one-line errors)."""
    # the command line is checked as tokenpo.train checks it (preflight sits above the planner, which the trainer
    # reads: imported here, by the command, not by the planner's modules)
    from tokenpo.preflight import check_command_line, compose_and_validate

    check_command_line(CONF_DIR, "train", overrides)
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose_and_validate("train", overrides)


def run_world_size(cfg: TrainConfig) -> int:
    """Processes of the run: trainer.nproc local workers on each node, or an external launcher's WORLD_SIZE."""
    local = cfg.trainer.nproc * getattr(cfg.trainer, "nodes", 1)
    return max(local, int(os.environ.get("WORLD_SIZE", "1")))


@dataclass(frozen=True)
class Target:
    """What a plan is made for, and where each value came from (the header line says)."""

    device: str  # cuda | cpu
    device_from: str
    memory: int | None
    memory_from: str
    prompt_tokens: int
    prompt_from: str

    def line(self) -> str:
        memory = "no memory given" if self.memory is None else f"{format_bytes(self.memory)} ({self.memory_from})"
        return (f"planned for: {self.device} ({self.device_from}), {memory}; longest prompt {self.prompt_tokens} "
                f"tokens ({self.prompt_from})")


def plan_target(cfg: TrainConfig, args: argparse.Namespace) -> Target:
    """The device, its memory and the longest prompt the run would start with here, unless the arguments say."""
    device, device_from = (args.device, "--device") if args.device else (device_type(), "detected on this machine")
    if args.device_memory:
        memory, memory_from = parse_bytes(args.device_memory, "--device-memory"), "--device-memory"
    elif cfg.trainer.memory_limit is not None:
        memory, memory_from = parse_bytes(cfg.trainer.memory_limit, "trainer.memory_limit"), "trainer.memory_limit"
    elif device == "cuda":
        memory, memory_from = cuda_memory(), "the GPU's memory"
    else:
        memory, memory_from = host_memory(), "this machine's RAM"
    if isinstance(args.prompt_tokens, int):
        return Target(device, device_from, memory, memory_from, args.prompt_tokens, "--prompt-tokens")
    try:
        longest = run_prompt_lengths(cfg).train
        prompt_from = "the data's longest under its template, as start-up counts it"
    except ConfigError as err:  # the model's tokenizer or the data is not on this machine: plan for another one
        if args.prompt_tokens == "data":
            raise
        longest = cfg.data.max_prompt_tokens or DEFAULT_PROMPT_TOKENS
        key = "data.max_prompt_tokens" if cfg.data.max_prompt_tokens else "assumed"
        prompt_from = (f"{key}: the data's prompts cannot be counted here ({str(err)[:120]}...); --prompt-tokens N "
                       "sets it")
    return Target(device, device_from, memory, memory_from, longest, prompt_from)


def vllm_lines(plan: MemoryPlan) -> list[str]:
    """vLLM's share and what it holds beside the other parts: the headroom a total equal to the device hides."""
    share = plan.vllm
    if share is None:
        return []
    lines = [f"vLLM: {format_bytes(share.total)} = {format_bytes(share.weights)} weights + "
             f"{format_bytes(share.kv_cache)} KV cache and working memory, room for ~{share.sequences:,} sequences of "
             f"the longest prompt + max_new_tokens: {share.sequences / max(1, share.rows):.1f}x the {share.rows} one "
             "process generates at once (vLLM schedules the rest in turns)"]
    if plan.device_memory is not None:
        vllm = next(part for part in plan.parts if part.name == P.VLLM_PART)
        others = dataclasses.replace(plan, parts=[part for part in plan.parts if part is not vllm])
        always, generation = others.phase_bytes(P.ALWAYS), others.phase_bytes(P.GENERATION)
        if vllm.phase == P.GENERATION:
            held = (f"while generating, vLLM's {format_bytes(share.total)} sits beside the other parts' "
                    f"{format_bytes(always + generation)}; during the update it sleeps and they peak at "
                    f"{format_bytes(always + others.phase_bytes(P.UPDATE))}")
        else:
            held = (f"vLLM's {format_bytes(share.total)} is held all run beside the other parts' peak of "
                    f"{format_bytes(others.total_bytes)}")
        free = plan.device_memory - plan.total_bytes
        lines.append(f"headroom: {held}; {format_bytes(max(0, free))} of the {format_bytes(plan.device_memory)} left"
                     + (" (rollout.vllm.gpu_memory_utilization=null: vLLM takes what the other parts leave)"
                        if abs(free) < 2**20 else ""))
    return lines


def server_lines(plan: MemoryPlan) -> list[str]:
    """The servers' part (rollout=vllm_server): per GPU against its share, with the changes that fit; servers on
    the CPU or elsewhere as a guide."""
    servers = plan.servers
    if servers is None:
        return []
    capped = "" if servers.max_num_seqs is None else ", vLLM's --max-num-seqs"
    load = (f"the step's {servers.sequences:,} sequences at once ({servers.sequences_per_replica:,} per replica"
            f"{capped}) of {servers.prompt_tokens} + {servers.new_tokens} tokens, {servers.dtype}")
    if servers.placement != ON_GPUS:
        where = ("a CPU server tokenpo starts, its KV cache rollout.vllm.kv_cache_gib in the host's RAM"
                 if servers.placement == ON_CPU else
                 f"{servers.replicas} server(s) at rollout.server.urls (a replica here: one server), sized by whoever "
                 "runs them")
        return [f"servers (rollout=vllm_server): {where}; per replica, as a guide, for "
                f"{load}: {format_bytes(servers.weights)} weights + {format_bytes(servers.replica_kv_cache)} KV cache "
                f"= {format_bytes(servers.weights + servers.replica_kv_cache)}"]
    gpus = ", ".join(map(str, servers.gpus))
    per_gpu = (f"per GPU: {format_bytes(servers.gpu_weights)} weights + {format_bytes(servers.gpu_kv_cache)} KV cache "
               f"= {format_bytes(servers.gpu_bytes)}")
    lines = [f"servers (rollout=vllm_server): {servers.replicas} replica(s) on GPUs {gpus} of this node, tensor "
             f"parallel {servers.tensor_parallel}, apart from the trainer's parts; {load}"]
    if servers.gpu_budget is None:
        return lines + [f"  {per_gpu}; the GPUs' memory is not known here (--device cuda --device-memory N checks it)"]
    share = (f"rollout.server.gpu_memory_utilization={servers.gpu_memory_utilization} x "
             f"{format_bytes(servers.gpu_memory)} (the plan's device memory: GPUs of the trainer's kind) = "
             f"{format_bytes(servers.gpu_budget)}")
    at_once = servers.sequences_at_once
    if servers.fits:
        verdict = f"fits (room for ~{at_once:,} sequences at once per replica; vLLM's working memory takes the rest)"
    elif at_once:
        verdict = (f"DOES NOT FIT the step's sequences: room for ~{at_once:,} of the replica's "
                   f"{servers.sequences_per_replica:,} at once (vLLM runs the rest in turns)")
    else:
        verdict = "DOES NOT FIT: not even the weights and one sequence's KV cache (vLLM will not start)"
    lines.append(f"  {per_gpu} of {share}: {verdict}")
    if servers.changes:
        first, *others = servers.changes
        lines.append(f"  suggested server change: {first.change} ({format_bytes(first.gpu_bytes)} per GPU)")
        lines += [f"    or {other.change} ({format_bytes(other.gpu_bytes)} per GPU)" for other in others]
    elif servers.fits is False:
        lines.append("  no listed change fits: more server GPUs (rollout.server.devices), shorter sequences or a "
                     "smaller model")
    return lines


def describe(plan: MemoryPlan, cfg: TrainConfig, target: Target | None = None) -> str:
    shapes, deepspeed = plan.shapes, cfg.deepspeed
    lines = [*([target.line()] if target else []),
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
    lines += vllm_lines(plan)
    if plan.fits is False:
        if plan.suggestions:
            first, *others = plan.suggestions
            lines.append(f"suggested change: {first.change} (total {format_bytes(first.total_bytes)})")
            lines += [f"  or {other.change} (total {format_bytes(other.total_bytes)})" for other in others]
        else:
            lines.append("no single listed change fits: more processes (ZeRO-3 shards by the process count), "
                         "shorter sequences or a smaller model")
    return "\n".join(lines + server_lines(plan))


def prompt_tokens_arg(value: str) -> int | str:
    if value == "data":
        return value
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a token count or 'data', got {value!r}") from None


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="tokenpo-plan", description=__doc__.split("\n\n")[0],
                                     epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("overrides", nargs="*", help="the overrides of tokenpo.train (key=value, group=option)")
    parser.add_argument("--json", action="store_true", help="print one JSON object (total_bytes, parts)")
    parser.add_argument("--device-memory", help="memory of one device, e.g. 80GiB (default: trainer.memory_limit, "
                                                "else the GPU's memory, or the RAM on CPU)")
    parser.add_argument("--world-size", type=int, help="processes in all (default: trainer.nproc, or WORLD_SIZE)")
    parser.add_argument("--device", choices=("cuda", "cpu"),
                        help="what the processes run on (default: this machine's, CUDA where torch finds a GPU)")
    parser.add_argument("--prompt-tokens", type=prompt_tokens_arg,
                        help="longest prompt in tokens (default, or 'data': the longest of the run's data under its "
                             "template, counted by the model's tokenizer, as tokenpo.train plans at start-up)")
    return parser.parse_intermixed_args(argv)  # overrides before, between or after the options


def main(argv: list[str] | None = None) -> None:
    quiet_library_bars()  # a tokenizer's or dataset's download bars into a pipe: only the plan's lines
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        cfg = compose_train_config(args.overrides)
        world = args.world_size or run_world_size(cfg)
        if world < 1:
            raise ConfigError(f"--world-size must be >= 1, got {world}")
        target = plan_target(cfg, args)
        plan = build_plan(cfg, world, target.memory, target.prompt_tokens, device=target.device)
    except ConfigError as err:
        print(f"tokenpo.plan: error: {err}", file=sys.stderr)
        sys.exit(2)
    if args.json:
        print(json.dumps({**plan.as_json(), "device": target.device, "memory_from": target.memory_from,
                          "prompt_from": target.prompt_from}, indent=1))
    else:
        print(describe(plan, cfg, target))

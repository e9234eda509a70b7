"""Worst case first: before step 1, one forward and backward at the largest shapes the run can meet, so a run that
will not fit fails in its first minute instead of at the step whose batch is the longest; and an out-of-memory
error at any step as one line naming the step, the shapes and the memory plan's suggested change.

The pass uses the longest training prompts, every response at max_new_tokens, the largest micro-batch one process
trains on, and the no-grad passes the algorithm runs (old log-probs and entropy, the KL reference). It changes
nothing: no optimizer step; the loss is multiplied by 0, so the gradients it leaves are exact zeros that the first
step's gradients add to (x + 0 = x); and every random stream (CPU and CUDA) is restored after it.
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import TYPE_CHECKING

import torch

from tokenpo import algorithms as alg
from tokenpo.data import Example
from tokenpo.deepspeed import dist
from tokenpo.errors import ConfigError
from tokenpo.plan.memory import Shapes, build_plan, device_type, memory_limit, run_shapes
from tokenpo.plan.units import format_bytes
from tokenpo.trainer.core.policy import Policy
from tokenpo.rewards import RewardConfig
from tokenpo.trainer.core.batch import RolloutBatch
from tokenpo.trainer.core.rollouts import StepRollouts, rollout_batch
from tokenpo.trainer.core.step import StepSettings, row_logprobs

if TYPE_CHECKING:
    from tokenpo.config import TrainConfig

log = logging.getLogger("tokenpo")


def worst_case_enabled(flag: bool | None, device: torch.device) -> bool:
    """trainer.worst_case_first (`flag`), or (null) on with CUDA, off on CPU."""
    return device.type == "cuda" if flag is None else flag


def worst_case_rollouts(prompt_ids: list[list[int]], group_size: int, shapes: Shapes,
                        reward: RewardConfig) -> RolloutBatch:
    """The largest micro-batch's groups: the `micro_groups` longest training prompts (repeated when there are fewer),
    each with G responses of max_new_tokens tokens (their ids do not matter for memory: the first prompt's first
    token)."""
    longest_first = sorted(prompt_ids, key=len, reverse=True)
    prompts = [longest_first[i % len(longest_first)] for i in range(shapes.micro_groups)]
    filler = [prompts[0][0]] * shapes.new_tokens
    rows = len(prompts) * group_size
    return rollout_batch(StepRollouts(examples=[Example("worst-case", "", "")] * len(prompts), prompt_ids=prompts,
                                      response_ids=[filler] * rows, response_text=[""] * rows,
                                      truncated=[True] * rows, verdicts=[""] * rows), reward)


def run_worst_case(cfg: TrainConfig, run: StepSettings, policy: Policy, prompt_ids: list[list[int]]) -> Shapes:
    """The pass described above over the training prompts' token ids; returns the shapes it ran (the longest
    prompt's length as prompt_tokens). `cfg`: the memory plan's shapes and its out-of-memory advice read it all."""
    # the longest training prompt: a token budget's largest micro-batch holds rows of it + max_new_tokens
    shapes = run_shapes(cfg, dist.world_size(), max(map(len, prompt_ids)))
    rollouts = worst_case_rollouts(prompt_ids, cfg.rollout.group_size, shapes, run.reward)
    # one process, one mini-batch: this process's micro-batches of the largest shapes
    micro_batches = rollouts.plan(run.split(cfg.rollout.group_size), 1, 1).of_rank(0)
    devices = [policy.device] if policy.device.type == "cuda" else []
    start = time.perf_counter()
    with out_of_memory_reported(cfg, "the worst-case pass before step 1", shapes), \
            torch.random.fork_rng(devices=devices):
        if run.needs_old_logprobs:
            row_logprobs(run, policy, rollouts, micro_batches, reference=False)
        if alg.needs_reference(run.algorithm):
            row_logprobs(run, policy, rollouts, micro_batches, reference=True)
        # every row here has the same length: the first micro-batch is the largest one
        largest = micro_batches[0][0]
        out = policy.logprobs(rollouts.tokens(largest, run.pad_token_id, policy.device), grad=True,
                              with_entropy=True, entropy_grad=alg.needs_entropy_grad(run.algorithm))
        entropy = out.entropy
        loss = out.logp.sum() + (entropy.sum() if entropy is not None and entropy.requires_grad else 0.0)
        policy.backward(loss * 0.0)
    peak = f", peak CUDA memory {format_bytes(torch.cuda.max_memory_allocated(policy.device))}" if devices else ""
    log.info("worst case first: forward + backward of %d sequences x (%d + %d) tokens in %.1f s%s",
             len(largest.rows), shapes.prompt_tokens, shapes.new_tokens, time.perf_counter() - start, peak)
    return shapes


def out_of_memory_message(cfg, where: str, shapes: Shapes) -> str:
    """One line: where, the shapes, and the memory plan's suggested change (a change that lowers the plan's total
    even when the plan thought the run fits)."""
    described = (f"{shapes.rollout_rows} sequences generated at once, micro-batches of {shapes.micro_rows} "
                 f"sequences, prompts up to {shapes.prompt_tokens} + responses up to {shapes.new_tokens} tokens")
    try:
        device = device_type()
        plan = build_plan(cfg, shapes.world, None, shapes.prompt_tokens, suggest=False, device=device)
        limit = min(memory_limit(cfg) or plan.total_bytes, plan.total_bytes - 1)
        plan = build_plan(cfg, shapes.world, limit, shapes.prompt_tokens, device=device)
        advice = (f"suggested: {plan.suggestions[0][0]} (plan {format_bytes(plan.suggestions[0][1])} instead of "
                  f"{format_bytes(plan.total_bytes)})" if plan.suggestions
                  else f"no single listed change lowers the plan's {format_bytes(plan.total_bytes)} enough")
    except ConfigError as err:  # no config.json to plan from
        advice = f"no memory plan ({err})"
    return (f"out of memory in {where} ({described}); {advice}; python -m tokenpo.plan <the same overrides> lists "
            f"the parts; the last checkpoint is intact")


def step_shapes(cfg) -> Shapes:
    """A step's largest shapes as the plan has them (the prompt length: data.max_prompt_tokens, or the plan's
    default)."""
    return run_shapes(cfg, dist.world_size(), None)


@contextlib.contextmanager
def out_of_memory_reported(cfg, where: str, shapes: Shapes):
    """An out-of-memory error inside becomes a one-line ConfigError naming `where` and `shapes`."""
    try:
        yield
    except torch.OutOfMemoryError:
        raise ConfigError(out_of_memory_message(cfg, where, shapes)) from None

"""The servers of an engine that generates on servers of its own (rollout=vllm_server, tokenpo.rollout.server):
their GPUs are not the trainer's, so the plan sizes them apart, per replica and per GPU of a replica: the weights in
rollout.vllm.dtype and the KV cache of the sequences one step sends them at once, both split over the replica's
tensor-parallel GPUs, against rollout.server.gpu_memory_utilization x the GPU's memory. vLLM's activations and CUDA
graphs take the rest of that share (vLLM sizes its KV cache in what they leave).

Servers on the CPU or given by URL are sized by whoever runs them (rollout.vllm.kv_cache_gib for tokenpo's CPU
server): the plan gives their figures as a guide and no verdict.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import NamedTuple

from tokenpo.plan.architecture import Architecture
from tokenpo.plan.parts import kv_cache_bytes
from tokenpo.rollout.config import RolloutConfig
from tokenpo.schema import require

# where the servers run: GPUs of this node tokenpo starts them on, a CPU server tokenpo starts, or servers elsewhere
ON_GPUS, ON_CPU, ELSEWHERE = "gpus", "cpu", "urls"
# the largest gpu_memory_utilization a change suggests: vLLM's default 0.9, and a little more for a GPU of its own
MAX_SERVER_SHARE = 0.95


class ServerChange(NamedTuple):
    """A change (as overrides) that makes each server GPU hold the step's sequences, and its bytes per GPU with it."""

    change: str
    gpu_bytes: int


@dataclass(frozen=True)
class ServerPlan:
    """The servers' memory per replica and per GPU, from the run's shapes."""

    placement: str  # ON_GPUS | ON_CPU | ELSEWHERE
    gpus: tuple[int, ...]  # rollout.server.devices on GPUs, else empty
    replicas: int  # data-parallel replicas on GPUs, the CPU server, or one per URL (its own replicas unknown)
    tensor_parallel: int  # GPUs one replica spans
    kv_heads: int  # the model's: tensor parallel splits them, and below one per GPU vLLM replicates them
    sequences: int  # sequences the trainer's processes send the servers at once: one step's generate calls
    max_num_seqs: int | None  # vLLM's --max-num-seqs of rollout.server.extra_args: a replica runs at most as many
    prompt_tokens: int  # the longest prompt
    new_tokens: int  # rollout.max_new_tokens
    weights: int  # one replica's weights, in rollout.vllm.dtype
    dtype: str  # rollout.vllm.dtype, auto resolved
    kv_per_token: int  # KV-cache bytes of one token on one replica (tokenpo.plan.parts.kv_cache_bytes)
    gpu_memory: int | None  # one server GPU's memory: the plan's device memory (GPUs of the trainer's kind)
    gpu_memory_utilization: float
    changes: tuple[ServerChange, ...] = ()

    @property
    def sequences_per_replica(self) -> int:
        """The replica's share of the step's sequences that it runs at once (vLLM queues those over --max-num-seqs)."""
        share = math.ceil(self.sequences / self.replicas)
        return share if self.max_num_seqs is None else min(share, self.max_num_seqs)

    @property
    def sequence_tokens(self) -> int:
        return self.prompt_tokens + self.new_tokens

    @property
    def replica_kv_cache(self) -> int:
        """KV cache of the replica's share of the step's sequences, each of the longest prompt + max_new_tokens."""
        return self.kv_per_token * self.sequences_per_replica * self.sequence_tokens

    @property
    def kv_shards(self) -> int:
        """GPUs the KV cache splits over: each holds kv_heads / tensor_parallel heads, at least one."""
        return min(self.tensor_parallel, self.kv_heads)

    @property
    def gpu_weights(self) -> int:
        return math.ceil(self.weights / self.tensor_parallel)

    @property
    def gpu_kv_cache(self) -> int:
        return math.ceil(self.replica_kv_cache / self.kv_shards)

    @property
    def gpu_bytes(self) -> int:
        return self.gpu_weights + self.gpu_kv_cache

    @property
    def gpu_budget(self) -> int | None:
        """What vLLM takes of each GPU: gpu_memory_utilization x its memory (None: not on GPUs, or unknown)."""
        if self.placement != ON_GPUS or self.gpu_memory is None:
            return None
        return int(self.gpu_memory_utilization * self.gpu_memory)

    @property
    def fits(self) -> bool | None:
        budget = self.gpu_budget
        return None if budget is None else self.gpu_bytes <= budget

    @property
    def sequences_at_once(self) -> int | None:
        """Sequences of the longest prompt + max_new_tokens one replica's KV cache holds beside its weights."""
        budget = self.gpu_budget
        if budget is None:
            return None
        one_sequence_per_gpu = self.kv_per_token * self.sequence_tokens / self.kv_shards
        return max(0, int((budget - self.gpu_weights) // one_sequence_per_gpu))

    def as_json(self) -> dict:
        return {
            "placement": self.placement, "gpus": list(self.gpus), "replicas": self.replicas,
            "tensor_parallel_size": self.tensor_parallel, "dtype": self.dtype, "sequences": self.sequences,
            "sequences_per_replica": self.sequences_per_replica, "sequence_tokens": self.sequence_tokens,
            "replica_weights_bytes": self.weights, "replica_kv_cache_bytes": self.replica_kv_cache,
            "gpu_weights_bytes": self.gpu_weights, "gpu_kv_cache_bytes": self.gpu_kv_cache,
            "gpu_bytes": self.gpu_bytes, "gpu_memory_bytes": self.gpu_memory,
            "gpu_memory_utilization": self.gpu_memory_utilization, "gpu_budget_bytes": self.gpu_budget,
            "fits": self.fits, "sequences_at_once": self.sequences_at_once,
            "changes": [change._asdict() for change in self.changes],
        }


class ServeArgs(NamedTuple):
    """rollout.server.extra_args read for the plan."""

    others: list[str]  # every argument but a --max-num-seqs and its value
    max_num_seqs: int | None


def split_max_num_seqs(extra_args: tuple) -> ServeArgs:
    """`vllm serve`'s extra arguments and the value of a --max-num-seqs among them (`--max-num-seqs N` or
    `--max-num-seqs=N`)."""
    args, rest, value = [str(arg) for arg in extra_args], [], None
    at = 0
    while at < len(args):
        if args[at] == "--max-num-seqs" and at + 1 < len(args):
            value, at = args[at + 1], at + 2
            continue
        if args[at].startswith("--max-num-seqs="):
            value = args[at].split("=", 1)[1]
        else:
            rest.append(args[at])
        at += 1
    require(value is None or value.isdigit(),
            f"rollout.server.extra_args: --max-num-seqs takes a count of sequences, got {value!r}")
    return ServeArgs(rest, None if value is None else int(value))


class Placement(NamedTuple):
    """Where the servers run, as tokenpo.rollout.server.launch starts them."""

    where: str  # ON_GPUS | ON_CPU | ELSEWHERE
    gpus: tuple[int, ...]
    replicas: int
    tensor_parallel: int


def server_placement(rollout: RolloutConfig) -> Placement:
    server = rollout.server
    if server.urls:
        return Placement(ELSEWHERE, (), len(server.urls), server.tensor_parallel_size)
    if server.devices == ("cpu",):
        return Placement(ON_CPU, (), 1, 1)
    gpus = tuple(int(device) for device in server.devices)
    return Placement(ON_GPUS, gpus, len(gpus) // server.tensor_parallel_size, server.tensor_parallel_size)


def server_plan(rollout: RolloutConfig, arch: Architecture, params: int, elem: int, dtype: str, sequences: int,
                prompt_tokens: int, gpu_memory: int | None) -> ServerPlan:
    """The servers' plan for `sequences` at once of `prompt_tokens` + rollout.max_new_tokens, in `elem`-byte weights
    and KV cache (rollout.vllm.dtype, `dtype` its name), with the changes that fit where each GPU does not."""
    extra_args = rollout.server.extra_args
    plan = ServerPlan(*server_placement(rollout), arch.num_kv_heads, sequences,
                      split_max_num_seqs(extra_args).max_num_seqs, prompt_tokens, rollout.max_new_tokens, params * elem, dtype,
                      kv_cache_bytes(arch, 1, 1, elem), gpu_memory, rollout.server.gpu_memory_utilization)
    if plan.fits is not False:
        return plan
    return dataclasses.replace(plan, changes=tuple(server_changes(plan, extra_args)))


def server_changes(plan: ServerPlan, extra_args: tuple) -> list[ServerChange]:
    """For each change that can make a server GPU hold the step's sequences, its mildest option that does: a larger
    share of the GPU (up to MAX_SERVER_SHARE), more tensor parallel (fewer replicas, each over more GPUs: the weights
    split further, the KV cache per GPU the same), fewer sequences at once (vLLM's --max-num-seqs, the rest in
    turns; after the `extra_args` set) or a lower rollout.max_new_tokens (halved)."""
    found = []
    share = math.ceil(100 * plan.gpu_bytes / plan.gpu_memory) / 100
    if share <= MAX_SERVER_SHARE:
        found.append(ServerChange(f"rollout.server.gpu_memory_utilization={share}", plan.gpu_bytes))
    gpus = len(plan.gpus)
    wider = [dataclasses.replace(plan, tensor_parallel=size, replicas=gpus // size)
             for size in range(plan.tensor_parallel + 1, gpus + 1) if gpus % size == 0]
    found += [ServerChange(f"rollout.server.tensor_parallel_size={option.tensor_parallel}", option.gpu_bytes)
              for option in wider if option.fits][:1]
    at_once = plan.sequences_at_once
    if at_once:
        fewer = dataclasses.replace(plan, max_num_seqs=at_once)
        args = ",".join([*split_max_num_seqs(extra_args).others, "--max-num-seqs", str(at_once)])
        found.append(ServerChange(f"rollout.server.extra_args=[{args}]", fewer.gpu_bytes))
    shorter = [dataclasses.replace(plan, new_tokens=plan.new_tokens // 2**k)
               for k in range(1, plan.new_tokens.bit_length())]
    found += [ServerChange(f"rollout.max_new_tokens={option.new_tokens}", option.gpu_bytes)
              for option in shorter if option.fits][:1]
    return found


"""A run's memory plan: the parts (tokenpo.plan.parts) for the composed config, the peak per process, and the
smallest listed change that fits when it does not."""

from __future__ import annotations

import dataclasses
import logging
import math
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

from tokenpo import algorithms as alg
from tokenpo.errors import ConfigError
from tokenpo.models.config import is_flash_attention
from tokenpo.plan import parts as P
from tokenpo.plan.architecture import Architecture, model_architecture, num_parameters
from tokenpo.plan.servers import ServerPlan, server_plan
from tokenpo.plan.units import format_bytes, parse_bytes
from tokenpo.rollout.config import DEFAULT_MEMORY_SHARE, RolloutConfig, VLLMConfig, vllm_sizing
from tokenpo.rollout.engine import ENGINES
from tokenpo.schema import require

if TYPE_CHECKING:
    from tokenpo.config import TrainConfig

log = logging.getLogger("tokenpo")

# prompt length assumed when data.max_prompt_tokens does not cap it and the caller does not know it
DEFAULT_PROMPT_TOKENS = 512
# free device memory left beside vLLM's share when the share is taken from what is free: the trainer's and vLLM's own
# allocations after the measurement (the CUDA graphs' pool, NCCL buffers, the allocator's rounding)
VLLM_START_MARGIN = 2**30
# the linear layers of a decoder layer, as PEFT's "all-linear" finds them (the output layer excluded)
LINEAR_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass
class Shapes:
    """The largest shapes a run meets, per process."""

    world: int
    prompt_tokens: int
    new_tokens: int
    rollout_rows: int  # sequences one process generates at once
    micro_rows: int  # sequences of the largest micro-batch
    micro_groups: int  # prompts (groups) of the largest micro-batch
    micro_batches: int  # micro-batches of one optimizer step on one process (gradients accumulate over them)


class Suggestion(NamedTuple):
    """A listed change (as overrides) and the plan's total with it."""

    change: str
    total_bytes: int


class ChangeOption(NamedTuple):
    """One option of a listed change: its overrides and the config they give."""

    change: str
    cfg: TrainConfig


@dataclass(frozen=True)
class VllmShare:
    """vLLM's part of a plan: its weights and the KV cache the rest of its bytes hold, in sequences of the longest
    prompt + max_new_tokens, against the sequences one process generates at once (the headroom)."""

    total: int  # the part's bytes
    weights: int
    one_sequence: int  # KV-cache bytes of one prompt + max_new_tokens sequence
    rows: int  # sequences one process generates at once

    @property
    def kv_cache(self) -> int:
        return max(0, self.total - self.weights)

    @property
    def sequences(self) -> int:
        return self.kv_cache // max(1, self.one_sequence)


@dataclass
class MemoryPlan:
    parts: list[P.Part]
    shapes: Shapes
    params: int
    trainable_params: int
    architecture_source: str
    device_memory: int | None
    suggestions: list[Suggestion] = field(default_factory=list)
    vllm: VllmShare | None = None  # a colocated engine's share (rollout=vllm)
    servers: ServerPlan | None = None  # an engine's servers of its own (rollout=vllm_server), apart from the parts

    def phase_bytes(self, phase: str) -> int:
        return sum(part.bytes for part in self.parts if part.phase == phase)

    @property
    def peak_phase(self) -> str:
        return P.GENERATION if self.phase_bytes(P.GENERATION) > self.phase_bytes(P.UPDATE) else P.UPDATE

    @property
    def total_bytes(self) -> int:
        return self.phase_bytes(P.ALWAYS) + max(self.phase_bytes(P.GENERATION), self.phase_bytes(P.UPDATE))

    @property
    def host_bytes(self) -> int:
        return sum(part.host_bytes for part in self.parts)

    @property
    def fits(self) -> bool | None:
        return None if self.device_memory is None else self.total_bytes <= self.device_memory

    def as_json(self) -> dict:
        return {
            "total_bytes": self.total_bytes,
            "device_memory_bytes": self.device_memory,
            "fits": self.fits,
            "peak_phase": self.peak_phase,
            "host_bytes": self.host_bytes,
            "parameters": self.params,
            "trainable_parameters": self.trainable_params,
            "architecture": self.architecture_source,
            "shapes": dataclasses.asdict(self.shapes),
            "parts": {part.name: {"bytes": part.bytes, "phase": part.phase, "host_bytes": part.host_bytes,
                                  "note": part.note} for part in self.parts},
            "suggestions": [suggestion._asdict() for suggestion in self.suggestions],
            "vllm": None if self.vllm is None else {"bytes": self.vllm.total, "weights": self.vllm.weights,
                                                    "kv_cache": self.vllm.kv_cache, "sequences": self.vllm.sequences,
                                                    "rows_at_once": self.vllm.rows},
            "servers": None if self.servers is None else self.servers.as_json(),
        }


def lora_rank(cfg: TrainConfig) -> int:
    return getattr(getattr(cfg.model, "lora", None), "rank", 0)


def lora_parameters(arch: Architecture, cfg: TrainConfig) -> int:
    """Adapter parameters: rank x (fan-in + fan-out) for every targeted linear layer of every decoder layer."""
    rank = lora_rank(cfg)
    targets = cfg.model.lora.target_modules
    names = LINEAR_MODULES if isinstance(targets, str) else [t for t in targets if t in LINEAR_MODULES]
    h, q, kv, i = arch.hidden_size, arch.q_dim, arch.kv_dim, arch.intermediate_size
    shapes = {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h), "gate_proj": (h, i),
              "up_proj": (h, i), "down_proj": (i, h)}
    return arch.num_layers * sum(rank * sum(shapes[name]) for name in names)


def run_shapes(cfg: TrainConfig, world: int, prompt_tokens: int | None) -> Shapes:
    """Worst case: the longest prompt, every response at max_new_tokens; the largest generate call and the
    largest micro-batch (tokenpo.trainer.core.batch.update_plan) one process meets."""
    g = cfg.rollout.group_size
    prompt = prompt_tokens or cfg.data.max_prompt_tokens or DEFAULT_PROMPT_TOKENS
    drawn = cfg.data.prompts_per_step
    dynamic_sampling = cfg.algorithm.dynamic_sampling
    if dynamic_sampling.enabled:
        drawn = alg.prompts_per_round(drawn, dynamic_sampling.oversample, world)
    groups_per_update = max(1, cfg.data.prompts_per_step // (world * cfg.trainer.mini_batches))
    rows = cfg.trainer.micro_batch_size
    budget = cfg.trainer.micro_batch_tokens
    if budget is not None:
        # a token budget: as many rows of prompt + max_new_tokens as it holds (at least one), from consecutive groups
        micro_rows = min(max(1, budget // (prompt + cfg.rollout.max_new_tokens)), groups_per_update * g)
        micro_groups, micro_batches = math.ceil(micro_rows / g), math.ceil(groups_per_update * g / micro_rows)
    elif rows < g:
        # below a group a micro-batch is a slice of one group's rows, its prompt run once: ceil(G / rows) per group
        micro_groups, micro_rows, micro_batches = 1, rows, groups_per_update * math.ceil(g / rows)
    else:
        micro_groups = min(rows // g, groups_per_update)
        micro_rows, micro_batches = micro_groups * g, math.ceil(groups_per_update / micro_groups)
    return Shapes(world=world, prompt_tokens=prompt, new_tokens=cfg.rollout.max_new_tokens,
                  rollout_rows=math.ceil(drawn / world) * g, micro_rows=micro_rows, micro_groups=micro_groups,
                  micro_batches=micro_batches)


def build_plan(cfg: TrainConfig, world: int, device_memory: int | None = None, prompt_tokens: int | None = None,
               suggest: bool = True, device: str = "cuda") -> MemoryPlan:
    """The plan of a run on `world` processes of `device` (cuda | cpu: only the runtime part differs)."""
    arch, source = model_architecture(cfg.model)

    def plan_of(changed: TrainConfig) -> MemoryPlan:
        return plan_for(changed, arch, source, world, device_memory, prompt_tokens, device)

    result = plan_of(cfg)
    if suggest and result.fits is False:
        result.suggestions = suggestions(cfg, plan_of, device_memory)
    return result


def plan_for(cfg: TrainConfig, arch: Architecture, source: str, world: int, device_memory: int | None,
             prompt_tokens: int | None, device: str) -> MemoryPlan:
    deepspeed, shapes = cfg.deepspeed, run_shapes(cfg, world, prompt_tokens)
    params = num_parameters(arch)
    model_elem = P.DTYPE_BYTES[cfg.model.dtype]
    elem = 2 if deepspeed.precision == "bf16" else model_elem
    lora = lora_rank(cfg) > 0
    trainable = lora_parameters(arch, cfg) if lora else params
    offload_opt = deepspeed.offload_optimizer
    stage = deepspeed.engine_stage  # what DeepSpeed runs (ZeRO-1 for ZeRO-0 with fp32 gradient sums under bf16)
    grad_elem = P.FP32 if deepspeed.fp32_grad_sums else elem
    parts = [
        P.runtime(device),
        P.policy_weights(params + (trainable if lora else 0), elem, deepspeed.stage, world, deepspeed.offload_param),
        # a reduce bucket never holds more than the gradients it reduces
        P.gradients(trainable, grad_elem, stage, world,
                    min(deepspeed.reduce_bucket_size, trainable) if stage >= 2 else 0),
        P.optimizer_states(trainable, stage, world, offload_opt),
        P.master_weights(trainable, stage, world, deepspeed.precision, offload_opt),
        P.reference_weights(params, elem, deepspeed.stage, world, alg.needs_reference(cfg.algorithm), lora),
    ]
    rollout = cfg.rollout
    rollout_at = len(parts)  # where the rollout part is listed
    policy_module = bool(ENGINES.trait(rollout.engine, "policy_module"))
    if policy_module:
        parts.append(P.hf_rollout(arch, shapes.rollout_rows, shapes.prompt_tokens, shapes.new_tokens, elem))
    ahead = bool(rollout.async_.max_staleness) and ENGINES.trait(rollout.engine, "ahead") == "process"
    if ahead:
        # an engine with weights of its own (vllm) is the engine's part below: the process adds the shared copy only
        parts.append(P.ahead_generator(arch, params, shapes.rollout_rows, shapes.prompt_tokens, shapes.new_tokens,
                                       model_elem, rollout.async_.generator_device != "cpu", policy_module))
    activations = P.activations(arch, shapes.micro_rows, shapes.micro_groups, shapes.prompt_tokens,
                                shapes.new_tokens, elem, cfg.model.gradient_checkpointing, packing(cfg))
    head = P.head_chunks(arch, shapes.micro_rows * shapes.new_tokens, cfg.trainer.logit_chunk_tokens,
                         cfg.trainer.recompute_head, alg.needs_entropy_grad(cfg.algorithm))
    parts += [activations, head]
    if stage == 0 and shapes.micro_batches == 1:
        # one backward per optimizer step: its gradients replace the activations layer by layer (P.gradients_in_backward)
        at = next(i for i, part in enumerate(parts) if part.name == "gradients")
        output_layer = 0 if lora else arch.vocab_size * arch.hidden_size * elem
        parts[at] = P.gradients_in_backward(trainable, elem, output_layer, activations.bytes + head.bytes)
    parts += P.zero3_gather(params, elem, deepspeed.stage, world, deepspeed.stage3_prefetch_bucket_size,
                            deepspeed.stage3_max_live_parameters, policy_module)
    share = None
    if ENGINES.trait(rollout.engine, "colocated"):
        # after the other parts: unsized, vLLM gets what they leave
        # generating ahead, vLLM never sleeps: it samples while the trainer updates
        v = dataclasses.replace(rollout.vllm, sleep_mode=False) if ahead else rollout.vllm
        part = vllm_part(v, arch, shapes, params, model_elem, parts, device_memory, device)
        parts.insert(rollout_at, part)
        share = vllm_share(part, rollout.vllm, arch, shapes, params, model_elem)
    servers = None
    if ENGINES.trait(rollout.engine, "servers"):
        # the servers' GPUs, taken as the trainer's kind: the plan's device memory when the trainer is on CUDA
        servers = server_plan(rollout, arch, params, vllm_elem(rollout.vllm, model_elem),
                              vllm_dtype(rollout.vllm, cfg.model.dtype), shapes.rollout_rows * shapes.world,
                              shapes.prompt_tokens, device_memory if device == "cuda" else None)
    return MemoryPlan(parts, shapes, params, trainable, source, device_memory, vllm=share, servers=servers)


def packing(cfg: TrainConfig) -> str | None:
    """How the update's passes are packed (tokenpo.models.logprobs._packed_hidden): none, each prompt once with its
    rows (`shared`, sdpa), or each row with its prompt under flash-attention (`flash`) or eager attention (`eager`)."""
    if not cfg.trainer.pack_sequences:
        return None
    implementation = cfg.model.attn_implementation
    if implementation == "sdpa":
        return "shared"
    return "flash" if is_flash_attention(implementation) else "eager"


def vllm_elem(v: VLLMConfig, model_elem: int) -> int:
    """Bytes per element of vLLM's weights and KV cache: rollout.vllm.dtype, auto the policy's."""
    return model_elem if v.dtype == "auto" else P.DTYPE_BYTES[v.dtype]


def vllm_dtype(v: VLLMConfig, model_dtype: str) -> str:
    """rollout.vllm.dtype's name, auto the policy's (model.dtype)."""
    return model_dtype if v.dtype == "auto" else v.dtype


def vllm_share(part: P.Part, v: VLLMConfig, arch: Architecture, shapes: Shapes, params: int,
               model_elem: int) -> VllmShare:
    """The colocated vLLM's `part` read as its weights and the KV cache the rest holds."""
    elem = vllm_elem(v, model_elem)
    one_sequence = P.kv_cache_bytes(arch, 1, shapes.prompt_tokens + shapes.new_tokens, elem)
    return VllmShare(part.bytes, params * elem, one_sequence, shapes.rollout_rows)


def vllm_part(v: VLLMConfig, arch: Architecture, shapes: Shapes, params: int, model_elem: int, others: list[P.Part],
              device_memory: int | None, device: str) -> P.Part:
    """vLLM as the engine sizes it on `device` (tokenpo.rollout.config.vllm_sizing): its KV cache's size when one is
    set (on CPU 1 GiB when null), else its share of the device, which with gpu_memory_utilization null is what the
    `others` parts leave."""
    elem = vllm_elem(v, model_elem)
    asleep = v.sleep_mode and device == "cuda"  # vLLM has no sleep mode on CPU
    kv_cache = vllm_sizing(v, device).kv_cache_bytes
    budget = None
    if kv_cache is None and device_memory is not None:
        budget = (int(v.gpu_memory_utilization * device_memory) if v.gpu_memory_utilization is not None
                  else P.vllm_budget(others, device_memory, asleep))
    one_sequence = P.kv_cache_bytes(arch, 1, shapes.prompt_tokens + shapes.new_tokens, elem)
    return P.vllm_rollout(params * elem, kv_cache, budget, one_sequence, asleep)


def with_vllm_share(cfg: TrainConfig, world: int) -> RolloutConfig:
    """cfg.rollout, with vLLM's gpu_memory_utilization as vLLM can start with it on this CUDA device now (called just
    before the engine starts, once the trainer has loaded). vLLM refuses to start unless the device's free memory is at
    least its share x the device (vLLM 0.32's worker checks it at start-up); what is free is measured here
    (torch.cuda.mem_get_info) and VLLM_START_MARGIN is kept back from it for the allocations after that look.

    A share that is set must fit in what is free: else one line names the free memory, the share asked and the key.
    A null share is the plan's (the bytes of its vLLM part, what the other parts leave, as a fraction of the device,
    vLLM's unit, rounded down), lowered to what is free, and refused in one line when that cannot hold vLLM's weights
    and one sequence's KV cache. Unchanged for an engine not colocated (servers of its own: rollout.server's share)
    or without a CUDA device."""
    rollout = cfg.rollout
    if not ENGINES.trait(rollout.engine, "colocated"):
        return rollout
    memory = cuda_free_memory()
    if memory is None:
        return rollout
    free, total = memory
    startable = max(0.0, math.floor(1000 * (free - VLLM_START_MARGIN) / total) / 1000)
    asked = rollout.vllm.gpu_memory_utilization
    state = (f"{format_bytes(free)} of the device's {format_bytes(total)} is free now that the trainer has loaded "
             f"(vLLM starts only when the free memory covers its share; {format_bytes(VLLM_START_MARGIN)} kept back)")
    if asked is not None:
        require(asked <= startable, f"rollout.vllm.gpu_memory_utilization={asked} asks vLLM for "
                                    f"{format_bytes(int(asked * total))}, but {state}: set it at most {startable}, or "
                                    f"null for the plan's share within what is free")
        return rollout
    try:
        plan = build_plan(cfg, world, memory_limit(cfg), suggest=False, device="cuda")
        least = vllm_bytes(build_plan(cfg, world, None, suggest=False, device="cuda"))
    except ConfigError as err:
        log.warning("vLLM's memory share: not planned (%s); gpu_memory_utilization %s, at most %s free", err,
                    DEFAULT_MEMORY_SHARE, startable)
        return replace_share(rollout, min(DEFAULT_MEMORY_SHARE, startable))
    planned = min(1.0, math.floor(1000 * vllm_bytes(plan) / total) / 1000)
    share = min(planned, startable)
    require(share * total >= least, f"vLLM needs {format_bytes(least)} (its weights and one sequence's KV cache) but "
                                    f"{state}: free memory (a smaller micro-batch, ZeRO stage or offload; "
                                    f"`python -m tokenpo.plan`) or set rollout.vllm.kv_cache_gib / gpu_memory_utilization")
    log.info("vLLM's memory share: gpu_memory_utilization %s (%s of %s: what the plan's other parts leave%s)", share,
             format_bytes(int(share * total)), format_bytes(total),
             "" if share == planned else f", lowered from {planned} to what is free: {format_bytes(free)}")
    return replace_share(rollout, share)


def vllm_bytes(plan: MemoryPlan) -> int:
    return next(part.bytes for part in plan.parts if part.name == P.VLLM_PART)


def replace_share(rollout: RolloutConfig, share: float) -> RolloutConfig:
    return dataclasses.replace(rollout, vllm=dataclasses.replace(rollout.vllm, gpu_memory_utilization=share))


def with_values(cfg: TrainConfig, **changes) -> TrainConfig:
    """A copy of `cfg` with `group__key=value` changes (e.g. deepspeed__stage=3)."""
    out = dataclasses.replace(cfg)
    for key, value in changes.items():
        group, name = key.split("__")
        setattr(out, group, dataclasses.replace(getattr(out, group), **{name: value}))
    return out


def smaller_micro_batches(cfg: TrainConfig) -> list[ChangeOption]:
    budget = cfg.trainer.micro_batch_tokens
    if budget is not None:  # halved while it holds a whole response
        budgets = [budget // 2**k for k in range(1, budget.bit_length()) if budget // 2**k > cfg.rollout.max_new_tokens]
        return [ChangeOption(f"trainer.micro_batch_tokens={size}", with_values(cfg, trainer__micro_batch_tokens=size))
                for size in budgets]
    sizes = [cfg.trainer.micro_batch_size // 2**k for k in range(1, cfg.trainer.micro_batch_size.bit_length())]
    return [ChangeOption(f"trainer.micro_batch_size={size}", with_values(cfg, trainer__micro_batch_size=size))
            for size in sizes]


def checkpointed_activations(cfg: TrainConfig) -> list[ChangeOption]:
    if cfg.model.gradient_checkpointing:
        return []
    return [ChangeOption("model.gradient_checkpointing=true", with_values(cfg, model__gradient_checkpointing=True))]


def recomputed_head(cfg: TrainConfig) -> list[ChangeOption]:
    if cfg.trainer.recompute_head:
        return []
    return [ChangeOption("trainer.recompute_head=true", with_values(cfg, trainer__recompute_head=True))]


def higher_zero_stage(cfg: TrainConfig) -> list[ChangeOption]:
    return [ChangeOption(f"deepspeed=zero{stage}", with_values(cfg, deepspeed__stage=stage))
            for stage in range(cfg.deepspeed.stage + 1, 4)]


def offload(cfg: TrainConfig) -> list[ChangeOption]:
    deepspeed, options = cfg.deepspeed, []
    if deepspeed.stage >= 1 and not deepspeed.offload_optimizer:
        options.append(ChangeOption("deepspeed.offload_optimizer=true",
                                    with_values(cfg, deepspeed__offload_optimizer=True)))
    if not deepspeed.offload_param:
        zero3 = dataclasses.replace(deepspeed, stage=3, offload_optimizer=True, offload_param=True)
        options.append(ChangeOption("deepspeed=zero3_offload", dataclasses.replace(cfg, deepspeed=zero3)))
    return options


def rollout_memory(cfg: TrainConfig) -> list[ChangeOption]:
    """Generating with the policy module (hf): vLLM instead, whose paged KV cache holds what fits in its share and
    schedules the rest; a colocated vLLM sized by its share of the device: a smaller share. Servers of its own take
    nothing of the trainer's device."""
    r = cfg.rollout
    if ENGINES.trait(r.engine, "policy_module"):
        vllm = dataclasses.replace(r, engine="vllm", vllm=dataclasses.replace(r.vllm, kv_cache_gib=None))
        return [ChangeOption("rollout=vllm rollout.vllm.kv_cache_gib=null", dataclasses.replace(cfg, rollout=vllm))]
    if not ENGINES.trait(r.engine, "colocated") or r.vllm.kv_cache_gib is not None \
            or r.vllm.gpu_memory_utilization is None:
        return []  # a KV cache of set size, or vLLM taking only what the other parts leave
    shares = [round(r.vllm.gpu_memory_utilization - 0.05 * k, 2) for k in range(1, 20)]
    return [ChangeOption(f"rollout.vllm.gpu_memory_utilization={u}", dataclasses.replace(
        cfg, rollout=dataclasses.replace(r, vllm=dataclasses.replace(r.vllm, gpu_memory_utilization=u))))
        for u in shares if u > 0]


def lora_adapters(cfg: TrainConfig) -> list[ChangeOption]:
    m = cfg.model
    if not hasattr(m, "lora") or lora_rank(cfg) > 0:
        return []
    return [ChangeOption("model.lora.rank=16", dataclasses.replace(cfg, model=dataclasses.replace(
        m, lora=dataclasses.replace(m.lora, rank=16))))]


# the listed changes, in the order a suggestion prefers them; each gives its options mildest first
CHANGES = (smaller_micro_batches, checkpointed_activations, recomputed_head, higher_zero_stage, offload,
           rollout_memory, lora_adapters)


def suggestions(cfg: TrainConfig, plan_of: Callable[[TrainConfig], MemoryPlan],
                device_memory: int) -> list[Suggestion]:
    """For each listed change (CHANGES), its mildest option that fits, with the total it gives; the first is the
    suggestion. When none fits alone: the changes' strongest options applied one after another, up to the first
    combination that fits (nothing when even all of them do not)."""
    def total(changed: TrainConfig) -> int:
        return plan_of(changed).total_bytes

    found = []
    for change_kind in CHANGES:
        fitting = [Suggestion(option.change, total(option.cfg)) for option in change_kind(cfg)]
        found += [suggestion for suggestion in fitting if suggestion.total_bytes <= device_memory][:1]
    if found:
        return found
    applied, changed = [], cfg
    for change_kind in CHANGES:
        options = change_kind(changed)
        if options:
            change, changed = options[-1]
            applied.append(change)
            if total(changed) <= device_memory:
                return [Suggestion(" ".join(applied), total(changed))]
    return []


def cuda_possible() -> bool:
    """False where no NVIDIA driver is installed (no nvidia-smi, as scripts/setup.sh tests): there the start-up check
    answers without importing torch, which takes seconds."""
    return shutil.which("nvidia-smi") is not None


def cuda_memory() -> int | None:
    """The CUDA device's memory in bytes, or None without one."""
    if not cuda_possible():
        return None
    import torch

    if not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory


def cuda_free_memory() -> tuple[int, int] | None:
    """(free, total) bytes of this process's CUDA device now, or None without one."""
    if cuda_memory() is None:
        return None
    import torch

    return torch.cuda.mem_get_info()


def host_memory() -> int:
    """This machine's RAM in bytes: what a CPU run's processes share."""
    import psutil

    return psutil.virtual_memory().total


def device_type() -> str:
    """What this machine's processes train on: cuda or cpu."""
    if not cuda_possible():
        return "cpu"
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def memory_limit(cfg: TrainConfig) -> int | None:
    """What one process may use: trainer.memory_limit, else the CUDA device's memory (None on CPU: no limit)."""
    if cfg.trainer.memory_limit is not None:
        return parse_bytes(cfg.trainer.memory_limit, "trainer.memory_limit")
    return cuda_memory()


def check_memory_plan(cfg: TrainConfig, world: int, prompt_tokens: int) -> MemoryPlan | None:
    """Start-up, before any model loads: the plan's total for the run's longest prompt (`prompt_tokens`, from its
    data: tokenpo.plan.context.run_prompt_lengths) in one line; ConfigError (one line) when it exceeds the memory a
    process may use. A model whose config.json cannot be found offline is not planned (a warning)."""
    limit = memory_limit(cfg)
    try:
        plan = build_plan(cfg, world, limit, prompt_tokens, device=device_type())
    except ConfigError as err:
        log.warning("memory plan: not computed (%s)", err)
        return None
    where = "trainer.memory_limit" if cfg.trainer.memory_limit is not None else "the CUDA device's memory"
    of_limit = "" if limit is None else f" of {format_bytes(limit)} ({where})"
    log.info("memory plan: %s per process at the %s phase's peak%s, for the data's longest prompt (%d tokens); "
             "python -m tokenpo.plan <the same overrides> --prompt-tokens %d lists its parts",
             format_bytes(plan.total_bytes), plan.peak_phase, of_limit, plan.shapes.prompt_tokens,
             plan.shapes.prompt_tokens)
    if plan.fits is False:
        hint = (f"suggested: {plan.suggestions[0].change} (plan {format_bytes(plan.suggestions[0].total_bytes)})"
                if plan.suggestions else "no single listed change fits")
        raise ConfigError(f"memory plan: {format_bytes(plan.total_bytes)} per process exceeds {where} "
                          f"{format_bytes(limit)}; {hint}; python -m tokenpo.plan <the same overrides> lists its parts")
    return plan

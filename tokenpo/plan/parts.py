"""Bytes of each part of a training process's memory, one small pure function per part.

Conventions (per process, `world` processes in all; Ψ = parameters; d = bytes of a training-precision element):
- DeepSpeed casts the policy to bf16 under deepspeed.precision=bf16 (d = 2), else keeps model.dtype.
- ZeRO 0, fp32: torch's AdamW on the parameters: exp_avg + exp_avg_sq = 8Ψ, no master copy.
  ZeRO 0, bf16 with deepspeed.grad_dtype=bf16: DeepSpeed's FP16_Optimizer (bf16 wrapper): a full fp32 master copy
  4Ψ and its fp32 gradient 4Ψ. With grad_dtype=fp32 (the default) DeepSpeed runs ZeRO-1 instead (the stage passed
  here is DeepSpeedConfig.engine_stage).
  ZeRO 1-3: DeepSpeed's ZeRO optimizers always keep an fp32 copy of this rank's partition (4Ψ/world, also when
  training in fp32) and an fp32 gradient of it at the step (4Ψ/world); Adam's two states are 8Ψ/world.
- Gradients in d bytes, or 4 under bf16 with fp32 gradient sums (deepspeed.grad_dtype): full at ZeRO 0-1, this
  rank's partition at ZeRO 2-3 plus one reduce bucket.
- Parameters: full at ZeRO 0-2, this rank's partition at ZeRO 3 plus the gathered layers (gather buffers).
- Offload moves the optimizer's parts (offload_optimizer) or the parameters (offload_param) to host memory.
A memory part belongs to a phase: `always` (held the whole run), `generation` (rollouts) or `update` (the
forward/backward passes); a process's peak is `always` plus the larger of the other two.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tokenpo.plan.architecture import Architecture
from tokenpo.plan.units import format_bytes

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
FP32 = 4
ALWAYS, GENERATION, UPDATE = "always", "generation", "update"


@dataclass(frozen=True)
class Part:
    name: str
    bytes: int
    phase: str
    note: str = ""
    host_bytes: int = 0  # what the part keeps in host memory instead (offload)


def shard(count: int, world: int) -> int:
    """This rank's share of `count` elements, as ZeRO pads a partition: ceil(count / world)."""
    return math.ceil(count / world)


def policy_weights(params: int, elem: int, stage: int, world: int, offload_param: bool) -> Part:
    held = shard(params, world) if stage == 3 else params
    if offload_param:
        return Part("policy weights", 0, ALWAYS, "ZeRO-3 parameters offloaded to host memory",
                    host_bytes=held * elem)
    note = f"ZeRO-3 partition 1/{world}" if stage == 3 else "full copy"
    return Part("policy weights", held * elem, ALWAYS, note)


def gradients(params: int, elem: int, stage: int, world: int, reduce_bucket: int) -> Part:
    if stage >= 2:
        return Part("gradients", (shard(params, world) + reduce_bucket) * elem, UPDATE,
                    f"partition 1/{world} + one reduce bucket of {reduce_bucket} elements")
    return Part("gradients", params * elem, UPDATE, "full")


# elements DeepSpeed's ZeRO-0 all-reduce flattens at a time (deepspeed.runtime.engine MEMORY_OPT_ALLREDUCE_SIZE)
ALLREDUCE_BUCKET = 500_000_000


def gradients_in_backward(params: int, elem: int, output_layer: int, activations_and_head: int) -> Part:
    """ZeRO 0, one micro-batch per optimizer step: the backward pass writes each layer's gradients as it frees that
    layer's activations, so beside the activations and the head there is only the first gradient written, the output
    layer's (`output_layer` bytes); after it the gradients are whole and DeepSpeed's all-reduce (also on one process)
    flattens a copy of up to ALLREDUCE_BUCKET of them. The part is what that adds to the activations and head's peak."""
    after_backward = (params + min(params, ALLREDUCE_BUCKET)) * elem
    return Part("gradients", max(output_layer, after_backward - activations_and_head), UPDATE,
                "full; written as the backward frees the activations, then one flat all-reduce copy")


def optimizer_states(params: int, stage: int, world: int, offload_optimizer: bool) -> Part:
    """AdamW's exp_avg and exp_avg_sq in fp32."""
    held = params if stage == 0 else shard(params, world)
    note = "AdamW exp_avg + exp_avg_sq, fp32" + ("" if stage == 0 else f", partition 1/{world}")
    if offload_optimizer:
        return Part("optimizer states", 0, ALWAYS, note + ", in host memory", host_bytes=2 * FP32 * held)
    return Part("optimizer states", 2 * FP32 * held, ALWAYS, note)


def master_weights(params: int, stage: int, world: int, precision: str, offload_optimizer: bool) -> Part:
    """The fp32 copy the optimizer steps on, and its fp32 gradient at the step (none at ZeRO 0 in fp32)."""
    if stage == 0 and precision == "fp32":
        return Part("fp32 master weights", 0, ALWAYS, "none: AdamW steps on the fp32 parameters")
    held = params if stage == 0 else shard(params, world)
    note = "fp32 copy + its fp32 gradient" + ("" if stage == 0 else f", partition 1/{world}")
    if offload_optimizer:
        return Part("fp32 master weights", 0, ALWAYS, note + ", in host memory", host_bytes=2 * FP32 * held)
    return Part("fp32 master weights", 2 * FP32 * held, ALWAYS, note)


def reference_weights(params: int, elem: int, stage: int, world: int, needed: bool, lora: bool) -> Part:
    """The frozen KL reference: a copy of the initial policy in the training dtype (d: the engine casts it as it
    casts the policy, so kl/ref is 0 at step 0), sharded like the policy at ZeRO-3."""
    if not needed:
        return Part("KL reference", 0, ALWAYS, "none: no KL term to the reference")
    if lora:
        return Part("KL reference", 0, ALWAYS, "none: the base model with the adapters switched off")
    held = shard(params, world) if stage == 3 else params
    return Part("KL reference", held * elem, ALWAYS, f"partition 1/{world}" if stage == 3 else "full copy")


def kv_cache_bytes(arch: Architecture, rows: int, tokens: int, elem: int) -> int:
    """Keys and values of every layer for `rows` sequences of `tokens` tokens."""
    return 2 * arch.num_layers * arch.kv_dim * rows * tokens * elem


def sampling_bytes(arch: Architecture, rows: int) -> int:
    """tokenpo.rollout.hf.sample_next on one decoded position: fp32 logits and softmax, float64 cumulative sum."""
    return rows * arch.vocab_size * (FP32 + FP32 + 8)


def hf_rollout(arch: Architecture, rows: int, prompt_tokens: int, new_tokens: int, elem: int) -> Part:
    kv = kv_cache_bytes(arch, rows, prompt_tokens + new_tokens, elem)
    return Part("rollout (hf)", kv + sampling_bytes(arch, rows), GENERATION,
                f"KV cache of {rows} sequences x ({prompt_tokens} + {new_tokens}) tokens + sampling buffers")


def ahead_generator(arch: Architecture, params: int, rows: int, prompt_tokens: int, new_tokens: int, elem: int,
                    on_device: bool, own_model: bool = True) -> Part:
    """rollout.async's generator process: the shared-memory copy the trainer pushes each version into (host memory),
    and with `own_model` (the hf engine) its own copy of the weights, its KV cache and sampling buffers (`hf_rollout`
    of the rounds it samples); an engine with weights of its own (vllm) is planned as that engine's part. On the
    trainer's device: none (the generator has a device of its own, or the CPU); the host bytes are listed."""
    shared = params * elem
    if not own_model:
        return Part("generator process (rollout.async)", 0, ALWAYS,
                    "the shared weights in host memory (its engine: the rollout part)", host_bytes=shared)
    own = params * elem + kv_cache_bytes(arch, rows, prompt_tokens + new_tokens, elem) + sampling_bytes(arch, rows)
    where = "its own device" if on_device else "host memory"
    return Part("generator process (rollout.async)", 0, ALWAYS,
                f"weights + KV cache on {where}, + the shared weights in host memory",
                host_bytes=shared + (0 if on_device else own))


# the rollout=vllm engine's part (tokenpo.plan.cli reads its headroom by this name)
VLLM_PART = "rollout (vllm)"


def vllm_rollout(weights: int, kv_cache: int | None, budget: int | None, min_kv_cache: int, asleep: bool) -> Part:
    """vLLM's own copy of the weights and its KV cache: weights + kv_cache when its size is set, else the budget vLLM
    sizes its KV cache in (gpu_memory_utilization x the device, or what the plan's other parts leave it), at least
    its weights and one sequence's KV cache (vLLM will not start with less). Asleep during the update where vLLM
    has a sleep mode (on CUDA): then it shares the generation phase's memory only."""
    phase = GENERATION if asleep else ALWAYS
    if kv_cache is not None:
        return Part(VLLM_PART, weights + kv_cache, phase, f"weights + {format_bytes(kv_cache)} KV cache")
    if budget is None:
        return Part(VLLM_PART, weights + min_kv_cache, phase, "weights + one sequence's KV cache: its share of "
                                                                     "an unknown device (pass --device-memory)")
    return Part(VLLM_PART, max(budget, weights + min_kv_cache), phase,
                "weights + KV cache in its share of the device (gpu_memory_utilization, or what the other parts leave)")


def vllm_budget(parts: list[Part], device_memory: int, asleep: bool) -> int:
    """What the other parts leave vLLM of `device_memory`: at the generation phase when it sleeps during the update,
    beside the larger phase when it does not."""
    always = sum(part.bytes for part in parts if part.phase == ALWAYS)
    generation = sum(part.bytes for part in parts if part.phase == GENERATION)
    update = sum(part.bytes for part in parts if part.phase == UPDATE)
    return device_memory - always - (generation if asleep else max(generation, update))


def layer_activation_bytes(arch: Architecture, elem: int) -> int:
    """Bytes autograd keeps per token in one decoder layer (HF Llama/Qwen2 code, SDPA attention), as counted by
    torch.autograd.graph.saved_tensors_hooks on SmolLM2-135M in fp32 and bf16 (docs/performance.md): 4 hidden-wide
    tensors in the training dtype (the layer input, the residual after attention, both RMSNorm outputs), the two
    RMSNorms' normalised values in fp32, 2 query-wide ones (the rotated queries, the attention output) and the MLP's
    4 (gate, SiLU(gate), up, their product)."""
    h, q, i = arch.hidden_size, arch.q_dim, arch.intermediate_size
    return (4 * h + 2 * q + 4 * i) * elem + 2 * h * FP32


def attention_keys_bytes(arch: Architecture, positions: int, elem: int) -> int:
    """One layer's keys and values over `positions` (summed over rows), as SDPA keeps them: expanded to every query
    head (transformers' repeat_kv runs whenever an attention mask is passed: left-padded prompts, cached prompts)."""
    return 2 * arch.q_dim * positions * elem


def final_norm_bytes(arch: Architecture, tokens: int, elem: int) -> int:
    """The decoder's final RMSNorm over its `tokens`: its input in fp32 (upcast below fp32) and the normalised value
    in the training dtype (the weight's product keeps it)."""
    return tokens * arch.hidden_size * (FP32 + elem)


def packed_mask_bytes(packed: str, tokens: int, elem: int) -> tuple[int, int]:
    """(held through the pass, peak while it is built) of transformers' mask over a packed pass of `tokens` positions,
    which it builds once per pass from the restarting positions (masking_utils.create_causal_mask), as measured with
    torch.profiler on CPU (transformers 5.25, 2048 positions): sdpa a bool [S, S] held, 5.0 S² bytes at its build
    (unused by segment_attention, which attends group by group); eager the mask in the training dtype, S² x elem
    held, 11.0 S² at fp32 while it is built (5 S² of bool operands, then its float form); flash-attention none."""
    if packed == "flash":
        return 0, 0
    if packed == "eager":
        return tokens * tokens * elem, 5 * tokens * tokens + int(1.5 * tokens * tokens * elem)
    return tokens * tokens, 5 * tokens * tokens


def activations(arch: Architecture, rows: int, groups: int, prompt_tokens: int, new_tokens: int, elem: int,
                checkpointing: bool, packed: str | None = None) -> Part:
    """The largest micro-batch's forward/backward (tokenpo.models.logprobs.response_token_hidden_states).

    Without checkpointing each group's prompt runs once and its KV cache serves its rows, whose responses (but
    the last token, which predicts nothing) run over it: every layer keeps its activations of groups x P +
    rows x (T - 1) tokens, and the keys and values of the prompts and of each row over its P + T - 1 positions;
    the attention mask (rows x (T - 1) x (P + T - 1)) is one tensor for all layers. With checkpointing every row
    runs prompt + response; each layer keeps only its input, plus one layer's activations, keys, values and mask
    while that layer is recomputed in the backward pass.

    Packed (trainer.pack_sequences) runs one sequence: `shared` (sdpa) each prompt once and its rows' responses, as
    many tokens as the shared-prompt pass, `flash` and `eager` each row with its prompt, rows x (P + T - 1) tokens.
    Attention runs prompt by prompt and row by row, each row's output kept apart from the concatenated one (one more
    query-wide tensor per token). Beside it, transformers' packed-sequence mask over the S tokens of the pass
    (packed_mask_bytes): none under flash-attention, which gets the rows' boundaries instead.
    """
    per_token, layers, h = layer_activation_bytes(arch, elem), arch.num_layers, arch.hidden_size
    response = max(new_tokens - 1, 0)
    if packed:
        tokens = groups * prompt_tokens + rows * response if packed == "shared" else rows * (prompt_tokens + response)
        # keys and values expanded to every head over the pass (a prompt attends through views of them) and, shared,
        # each row's own copy of its prompt's beside its own
        positions = tokens + (groups * prompt_tokens + rows * (prompt_tokens + response) if packed == "shared" else 0)
        per_packed_token = per_token + arch.q_dim * elem
        if checkpointing:
            one_layer = tokens * per_packed_token + attention_keys_bytes(arch, positions, elem)
            held = layers * tokens * h * elem + one_layer
        else:
            held = layers * (tokens * per_packed_token + attention_keys_bytes(arch, positions, elem))
        mask_held, mask_built = packed_mask_bytes(packed, tokens, elem)
        # the mask is built at the start of the pass, before any activation
        held = max(held + mask_held + final_norm_bytes(arch, tokens, elem), mask_built)
        return Part("activations", held, UPDATE, f"packed ({packed}): {rows} rows in one sequence of {tokens} tokens"
                                                 f"{', checkpointed' if checkpointing else ''}")
    if checkpointing:
        seq = prompt_tokens + new_tokens
        tokens = rows * seq
        one_layer = tokens * per_token + attention_keys_bytes(arch, tokens, elem) + rows * seq * seq * elem
        held = layers * tokens * h * elem + final_norm_bytes(arch, tokens, elem) + one_layer
        return Part("activations", held, UPDATE,
                    f"checkpointed: {rows} rows x {seq} tokens, layer inputs + one layer")
    tokens = groups * prompt_tokens + rows * response
    positions = groups * prompt_tokens + rows * (prompt_tokens + response)
    mask = (rows * response * (prompt_tokens + response) + groups * prompt_tokens**2) * elem
    held = layers * (tokens * per_token + attention_keys_bytes(arch, positions, elem)) + mask
    held += final_norm_bytes(arch, tokens, elem)
    return Part("activations", held, UPDATE,
                f"{groups} prompt(s) x {prompt_tokens} + {rows} responses x {response} tokens, every layer")


def head_chunks(arch: Architecture, response_tokens: int, chunk_tokens: int, recompute: bool,
                entropy_grad: bool) -> Part:
    """The output layer on response tokens (tokenpo.models.logprobs.response_logprobs), fp32 logits.

    Kept for backward per token: the tempered fp32 logits (logsumexp's input), and with a differentiable entropy
    its softmax and product; `recompute_head` keeps none of them. Working set, in chunk x vocabulary fp32 tensors
    (measured on CPU, docs/performance.md): three (logsumexp's exponentials, the entropy's softmax and product), four
    when recomputed (the backward pass recomputes a chunk beside its gradient)."""
    vocab = arch.vocab_size
    chunk = min(chunk_tokens, response_tokens)
    working = (4 if recompute else 3) * chunk * vocab * FP32
    kept_per_token = (0 if recompute else 1 + (2 if entropy_grad else 0)) * vocab * FP32
    note = ("recomputed in backward: one chunk" if recompute
            else f"{response_tokens} response tokens' fp32 logits kept for backward")
    return Part("log-prob/entropy head", response_tokens * kept_per_token + working, UPDATE,
                f"{note}, {chunk}-token chunks")


# memory a process takes beyond the plan's tensors. CUDA: the context, cuBLAS workspaces and NCCL buffers (about
# 1 GiB in common reports; scripts/check_gpu.sh measures it). CPU: the tokenizer, data, DeepSpeed and gloo state and
# Python objects of a run, measured by scripts/plan_vs_measured.py (its smallest row, docs/performance.md).
RUNTIME_BYTES = {"cuda": 2**30, "cpu": 40 * 2**20}


def runtime(device: str) -> Part:
    return Part("runtime", RUNTIME_BYTES[device], ALWAYS,
                "CUDA context, cuBLAS and NCCL buffers" if device == "cuda" else "tokenizer, data, DeepSpeed state")


def zero3_gather(params: int, elem: int, stage: int, world: int, prefetch_bucket: int, max_live: int,
                 gathers_for_generation: bool) -> list[Part]:
    """ZeRO-3's gathered parameters: while training at most max_live_parameters + a prefetch bucket, and for the
    hf engine's generation the whole model (tokenpo.deepspeed.engine.gathered_for_generation)."""
    if stage != 3 or world == 1:
        return []
    rest = params - shard(params, world)
    parts = [Part("ZeRO-3 gather (update)", min(rest, max_live + prefetch_bucket) * elem, UPDATE,
                  "stage3_max_live_parameters + stage3_prefetch_bucket_size, at most the other ranks' shares")]
    if gathers_for_generation:
        parts.append(Part("ZeRO-3 gather (generation)", rest * elem, GENERATION,
                          "the hf engine gathers the whole model for each generate call"))
    return parts

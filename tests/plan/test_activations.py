"""The activation part against what autograd keeps: the saved tensors of a real forward
(tokenpo.models.logprobs.response_logprobs on a small GQA Llama), counted by torch.autograd.graph.saved_tensors_hooks."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from tokenpo.models.loading import enable_activation_checkpointing
from tokenpo.models.logprobs import PassOptions, response_logprobs
from tokenpo.plan import parts as P
from tokenpo.plan.architecture import Architecture

LAYERS, HIDDEN, HEADS, KV_HEADS, INTERMEDIATE, VOCAB = 3, 64, 4, 2, 160, 300
ARCH = Architecture(vocab_size=VOCAB, hidden_size=HIDDEN, num_layers=LAYERS, num_heads=HEADS, num_kv_heads=KV_HEADS,
                    head_dim=HIDDEN // HEADS, intermediate_size=INTERMEDIATE, tie_word_embeddings=True,
                    qkv_bias=False, max_position_embeddings=512, context_length=512)
GROUPS, GROUP_SIZE, PROMPT, RESPONSE = 2, 3, 24, 16


def saved_bytes(dtype: torch.dtype, checkpointing: bool, packed: bool = False) -> tuple[int, int]:
    """(bytes of the distinct tensors autograd saved, parameters excluded; bytes the output layer keeps: its input rows
    and their fp32 logits, the head part's)."""
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=INTERMEDIATE, num_hidden_layers=LAYERS,
                         num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, tie_word_embeddings=True)
    config._attn_implementation = "sdpa"
    model = LlamaForCausalLM(config).to(dtype).train()
    if checkpointing:
        enable_activation_checkpointing(model)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    storages, kept = {}, []

    def pack(tensor):
        kept.append(tensor)  # alive until counted: no storage address is reused by a later tensor
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in params:
            storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    prompt = torch.randint(3, VOCAB, (GROUPS, PROMPT))
    response = torch.randint(3, VOCAB, (GROUPS * GROUP_SIZE, RESPONSE))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        response_logprobs(model, prompt, torch.ones_like(prompt), response, torch.ones_like(response),
                          prompt_index=torch.arange(GROUPS * GROUP_SIZE) // GROUP_SIZE,
                          options=PassOptions(packed=packed, with_entropy=False))
    head = GROUPS * GROUP_SIZE * RESPONSE * (VOCAB * P.FP32 + HIDDEN * dtype.itemsize)
    return sum(storages.values()), head


@pytest.mark.parametrize("dtype, elem", [(torch.float32, 4), (torch.bfloat16, 2)])
@pytest.mark.parametrize("checkpointing", [False, True])
def test_the_activation_part_is_what_autograd_saves(dtype, elem, checkpointing):
    saved, head = saved_bytes(dtype, checkpointing)
    part = P.activations(ARCH, GROUPS * GROUP_SIZE, GROUPS, PROMPT, RESPONSE, elem, checkpointing)
    if checkpointing:
        # saved in the forward pass: every layer's input and the final norm's; the plan adds the one layer that the
        # backward pass recomputes at a time, as the non-checkpointed pass keeps it for one layer over the same rows
        rows, tokens = GROUPS * GROUP_SIZE, GROUPS * GROUP_SIZE * (PROMPT + RESPONSE)
        planned = LAYERS * tokens * HIDDEN * elem + P.final_norm_bytes(ARCH, tokens, elem)
        one_layer = (tokens * P.layer_activation_bytes(ARCH, elem) + P.attention_keys_bytes(ARCH, tokens, elem)
                     + rows * (PROMPT + RESPONSE) ** 2 * elem)
        assert part.bytes == planned + one_layer
    else:
        planned = part.bytes
    # the rest (RMSNorm's [rows, tokens, 1] variances, positions, indices) is a few % at these small widths
    assert planned == pytest.approx(saved - head, rel=0.04)


@pytest.mark.parametrize("dtype, elem", [(torch.float32, 4), (torch.bfloat16, 2)])
def test_the_packed_activation_part_is_what_autograd_saves(dtype, elem):
    saved, head = saved_bytes(dtype, checkpointing=False, packed=True)  # sdpa: each prompt once, its rows after it
    part = P.activations(ARCH, GROUPS * GROUP_SIZE, GROUPS, PROMPT, RESPONSE, elem, False, packed="shared")
    assert part.bytes == pytest.approx(saved - head, rel=0.04)


def test_the_packed_mask_is_counted_as_each_attention_builds_it():
    """transformers builds an [S, S] mask over a packed pass from its positions: a bool one held under sdpa, one in
    the training dtype under eager, none under flash-attention (it gets the rows' boundaries); the build's own peak
    counts where it outweighs the pass's activations (P.packed_mask_bytes)."""
    rows = GROUPS * GROUP_SIZE
    tokens = rows * (PROMPT + RESPONSE - 1)  # each row with its prompt (flash, eager)
    parts = {kind: P.activations(ARCH, rows, GROUPS, PROMPT, RESPONSE, 2, False, packed=kind).bytes
             for kind in ("flash", "eager")}
    assert parts["eager"] - parts["flash"] == tokens * tokens * 2
    # a one-layer model 8 wide: the mask's build (5 bytes per position pair) is the pass's peak
    thin = Architecture(vocab_size=VOCAB, hidden_size=8, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=4,
                        intermediate_size=8, tie_word_embeddings=True, qkv_bias=False, max_position_embeddings=512,
                        context_length=512)
    shared = P.activations(thin, rows, GROUPS, PROMPT, RESPONSE, 2, False, packed="shared")
    assert shared.bytes == 5 * (GROUPS * PROMPT + rows * (RESPONSE - 1)) ** 2


@pytest.mark.parametrize("attention, kind", [("sdpa", "shared"), ("eager", "eager"),
                                             ("flash_attention_2", "flash"), ("flash_attention_3", "flash")])
def test_the_plan_packs_as_the_attention_implementation_does(attention, kind):
    from support.config import train_config
    from tokenpo.plan.memory import packing

    cfg = train_config("model=tiny", "trainer.pack_sequences=true", f"model.attn_implementation={attention}")
    assert packing(cfg) == kind

"""Padding-free packing (response_logprobs(packed=True), trainer.pack_sequences) and rows of several groups in any
order (prompt_index): log-probs, entropies and gradients equal the padded shared-prompt path's, with and without
grad and activation checkpointing, an empty response included; the packed pass runs no padding position."""

from __future__ import annotations

import pytest
import torch

from support.logprobs import PROMPT_INDEX, padded_batch
from tokenpo.models.loading import enable_activation_checkpointing
from tokenpo.models.logprobs import PassTokens, response_logprobs

# fp32: the packed pass sums attention over other positions in another order than the padded one (measured up to
# 2.9e-6 on log-probs of size ~2.5); test_logprobs allows the same against a plain forward
ATOL = 1e-5


def parameter_grads(model, logp, entropy):
    model.zero_grad()
    weights = torch.linspace(0.5, 1.5, logp.numel()).reshape(logp.shape)  # a token in a wrong slot shows
    ((logp + 0.3 * entropy) * weights).sum().backward()
    return {name: p.grad.clone() for name, p in model.named_parameters()}


@pytest.mark.parametrize("checkpointing", [False, True])
@pytest.mark.parametrize("grad", [False, True])
def test_packed_rows_give_the_padded_paths_values_and_gradients(model, checkpointing, grad):
    if checkpointing:
        enable_activation_checkpointing(model)
    model.train(checkpointing)  # transformers checkpoints only in training mode; the model has no dropout
    results = []
    for packed in (False, True):
        with torch.set_grad_enabled(grad):
            logp, entropy = response_logprobs(model, *padded_batch(), prompt_index=PROMPT_INDEX, packed=packed,
                                              chunk_tokens=5, entropy_grad=grad)
        results.append((logp, entropy, parameter_grads(model, logp, entropy) if grad else {}))
    (padded_logp, padded_entropy, padded_grads), (logp, entropy, grads) = results
    torch.testing.assert_close(logp, padded_logp, atol=ATOL, rtol=0)
    torch.testing.assert_close(entropy, padded_entropy, atol=ATOL, rtol=0)
    mask = padded_batch()[3].bool()
    assert (logp[~mask] == 0).all() and (logp[mask] < 0).all()
    for name, want in padded_grads.items():
        assert float(want.abs().max()) > 0, name
        # gradients of size up to ~26: measured up to 3.6e-5 apart (float32 sums in another order)
        torch.testing.assert_close(grads[name], want, atol=1e-4, rtol=1e-4, msg=name)


def test_rows_of_any_groups_in_any_order_read_their_own_prompt(model):
    """A token-budget micro-batch holds rows of several groups in any order: prompt_index picks each row's prompt."""
    prompt_ids, prompt_mask, response_ids, response_mask = padded_batch()
    order = torch.tensor([5, 0, 3, 2, 1])  # rows of both groups interleaved (row 4, the empty one, left out)
    with torch.no_grad():
        whole, _ = response_logprobs(model, prompt_ids, prompt_mask, response_ids, response_mask,
                                     prompt_index=PROMPT_INDEX)
        for packed in (False, True):
            some, _ = response_logprobs(model, prompt_ids, prompt_mask, response_ids[order], response_mask[order],
                                        prompt_index=PROMPT_INDEX[order], packed=packed)
            torch.testing.assert_close(some, whole[order, : some.shape[1]], atol=ATOL, rtol=0)


def test_the_packed_pass_runs_no_padding_and_the_padded_one_counts_its_own(model):
    batch = padded_batch()
    lengths = batch[3].sum(-1).long()
    prompt_lengths = batch[1].sum(-1)[PROMPT_INDEX]
    responses = int((lengths - 1)[lengths > 0].sum())  # every response but its last token
    packed, rows, padded = PassTokens(), PassTokens(), PassTokens()
    with torch.no_grad():
        response_logprobs(model, *batch, prompt_index=PROMPT_INDEX, packed=True, tokens=packed)
        model.config._attn_implementation = "eager"  # rows each with its prompt
        response_logprobs(model, *batch, prompt_index=PROMPT_INDEX, packed=True, tokens=rows)
        model.config._attn_implementation = "sdpa"
        response_logprobs(model, *batch, prompt_index=PROMPT_INDEX, tokens=padded)
    assert packed.fed == packed.real == int(batch[1].sum()) + responses  # sdpa: each prompt once
    assert rows.fed == rows.real == int(prompt_lengths[lengths > 0].sum()) + responses
    # shared prompts: each of the 2 prompts once (padded to 5), the responses in buckets padded to their longest (a
    # row shorter than its bucket's longest runs its last token too)
    prompts = int(batch[1].sum())
    assert padded.real < padded.fed
    assert prompts + int((lengths - 1).clamp(min=0).sum()) <= padded.real <= prompts + int(lengths.sum())


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_packing_keeps_attention_inside_each_row_under_sdpa_and_eager(model, attention):
    model.config._attn_implementation = attention
    with torch.no_grad():
        padded, _ = response_logprobs(model, *padded_batch(), prompt_index=PROMPT_INDEX)
        packed, _ = response_logprobs(model, *padded_batch(), prompt_index=PROMPT_INDEX, packed=True)
    # a row that attended to the rows before it in the packed sequence would differ
    torch.testing.assert_close(packed, padded, atol=ATOL, rtol=0)


@pytest.mark.parametrize("packed", [False, True])
def test_one_decoder_call_per_pass_whatever_the_lengths(model, packed, monkeypatch):
    """single_call (ZeRO-3 on several processes): the decoder runs once per pass, the same values as the buckets'."""
    calls = []
    decoder = model.get_decoder()
    forward = decoder.forward
    monkeypatch.setattr(decoder, "forward", lambda *args, **kwargs: calls.append(1) or forward(*args, **kwargs))
    with torch.no_grad():
        bucketed, _ = response_logprobs(model, *padded_batch(), prompt_index=PROMPT_INDEX)
        buckets = len(calls)
        calls.clear()
        once, _ = response_logprobs(model, *padded_batch(), prompt_index=PROMPT_INDEX, packed=packed, single_call=True)
    assert buckets == 2 and len(calls) == 1  # the buckets: the prompts, then the responses over their cache
    torch.testing.assert_close(once, bucketed, atol=ATOL, rtol=0)
    # no token to predict at all: still one call, so every rank makes the same collectives
    calls.clear()
    prompt_ids, prompt_mask, response_ids, response_mask = padded_batch()
    with torch.no_grad():
        response_logprobs(model, prompt_ids, prompt_mask, response_ids[4:5], response_mask[4:5],
                          prompt_index=PROMPT_INDEX[4:5], packed=packed, single_call=True)
    assert len(calls) == 1

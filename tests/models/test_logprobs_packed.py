"""Padding-free packing (PassOptions(packed=True), trainer.pack_sequences) and rows of several groups in any
order (prompt_index): log-probs, entropies and gradients equal the padded shared-prompt path's, with and without
grad and activation checkpointing, an empty response included; the packed pass runs no padding position. Importing
tokenpo.models.logprobs registers no attention function; the first packed pass registers its segment attention."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from support.env import REPO, cli_env
from support.logprobs import PROMPT_INDEX, padded_batch
from tokenpo.models.loading import enable_activation_checkpointing
from tokenpo.models.logprobs import PassOptions, PassTokens, response_logprobs, segment_attention

# fp32: the packed pass sums attention over other positions in another order than the padded one (measured up to
# 2.9e-6 on log-probs of size ~2.5); test_logprobs allows the same against a plain forward
ATOL = 1e-5
PACKED = PassOptions(packed=True)


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
            logp, entropy = response_logprobs(model, *padded_batch(), prompt_index=PROMPT_INDEX,
                                              options=PassOptions(packed=packed, chunk_tokens=5, entropy_grad=grad))
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
                                        prompt_index=PROMPT_INDEX[order], options=PassOptions(packed=packed))
            torch.testing.assert_close(some, whole[order, : some.shape[1]], atol=ATOL, rtol=0)


def test_the_packed_pass_runs_no_padding_and_the_padded_one_counts_its_own(model):
    batch = padded_batch()
    lengths = batch[3].sum(-1).long()
    prompt_lengths = batch[1].sum(-1)[PROMPT_INDEX]
    responses = int((lengths - 1)[lengths > 0].sum())  # every response but its last token
    packed, rows, padded = PassTokens(), PassTokens(), PassTokens()
    with torch.no_grad():
        response_logprobs(model, *batch, prompt_index=PROMPT_INDEX, options=PACKED, tokens=packed)
        model.config._attn_implementation = "eager"  # rows each with its prompt
        response_logprobs(model, *batch, prompt_index=PROMPT_INDEX, options=PACKED, tokens=rows)
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
        packed, _ = response_logprobs(model, *padded_batch(), prompt_index=PROMPT_INDEX, options=PACKED)
    # a row that attended to the rows before it in the packed sequence would differ
    torch.testing.assert_close(packed, padded, atol=ATOL, rtol=0)


def counted_decoder_calls(model, monkeypatch) -> list:
    calls = []
    decoder = model.get_decoder()
    forward = decoder.forward
    monkeypatch.setattr(decoder, "forward", lambda *args, **kwargs: calls.append(1) or forward(*args, **kwargs))
    return calls


def test_a_packed_pass_calls_the_decoder_once_whatever_the_lengths(model, monkeypatch):
    calls = counted_decoder_calls(model, monkeypatch)
    with torch.no_grad():
        bucketed, _ = response_logprobs(model, *padded_batch(), prompt_index=PROMPT_INDEX)
        buckets = len(calls)
        calls.clear()
        once, _ = response_logprobs(model, *padded_batch(), prompt_index=PROMPT_INDEX,
                                    options=PassOptions(packed=True, lockstep=True))
    assert buckets == 2 and len(calls) == 1  # the buckets: the prompts, then the responses over their cache
    torch.testing.assert_close(once, bucketed, atol=ATOL, rtol=0)
    # no token to predict at all: still one call, so every rank makes the same collectives
    calls.clear()
    prompt_ids, prompt_mask, response_ids, response_mask = padded_batch()
    with torch.no_grad():
        response_logprobs(model, prompt_ids, prompt_mask, response_ids[4:5], response_mask[4:5],
                          prompt_index=PROMPT_INDEX[4:5], options=PassOptions(packed=True, lockstep=True))
    assert len(calls) == 1


@pytest.mark.parametrize("grad", [False, True])
def test_in_lockstep_a_rank_runs_as_many_buckets_and_head_chunks_as_its_peers_and_keeps_its_own_values(
        model, monkeypatch, grad):
    """ZeRO-3 on several processes: a peer needs 4 buckets and 5 head chunks (logprobs.agreed_count stands in for
    the all-reduce). This rank's own buckets run as before and the extra calls keep nothing: values and gradients
    are the single-process ones, the empty response included."""
    from tokenpo.models import logprobs

    calls = counted_decoder_calls(model, monkeypatch)
    heads = []
    head = model.get_output_embeddings()
    head_forward = head.forward
    monkeypatch.setattr(head, "forward", lambda hidden: heads.append(len(hidden)) or head_forward(hidden))
    with torch.set_grad_enabled(grad):
        alone, alone_entropy = response_logprobs(model, *padded_batch(), prompt_index=PROMPT_INDEX,
                                                 options=PassOptions(chunk_tokens=5))
        alone_grads = parameter_grads(model, alone, alone_entropy) if grad else {}
        own_calls, own_heads = len(calls), list(heads)
        calls.clear(), heads.clear()
        peers = iter([4, 5])  # the buckets' count, then the head chunks'
        monkeypatch.setattr(logprobs, "agreed_count", lambda count, lockstep, device: max(count, next(peers)))
        logp, entropy = response_logprobs(model, *padded_batch(), prompt_index=PROMPT_INDEX,
                                          options=PassOptions(chunk_tokens=5, lockstep=True))
        grads = parameter_grads(model, logp, entropy) if grad else {}
    # the prompts and 1 bucket; 16 response tokens in chunks of 5
    assert own_calls == 2 and own_heads == [5, 5, 5, 1]
    assert len(calls) == 5 and heads == [5, 5, 5, 1, 0]  # the prompts and 4 buckets; 5 chunks, the last empty
    torch.testing.assert_close(logp, alone, atol=0, rtol=0)
    torch.testing.assert_close(entropy, alone_entropy, atol=0, rtol=0)
    for name, want in alone_grads.items():
        torch.testing.assert_close(grads[name], want, atol=1e-6, rtol=1e-6, msg=name)


def test_under_flash_attention_a_packed_pass_hands_over_the_rows_boundaries(model, monkeypatch):
    """flash-attention's varlen kernels get each row's offsets and the longest row from tokenpo (transformers would
    derive them from the positions in every layer, waiting for the device each time). A stand-in registered as
    flash_attention_2 runs each row on its own from the offsets it receives: the values are sdpa's."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    received = []

    def varlen(module, query, key, value, attention_mask, **kwargs):
        starts, longest = kwargs["cu_seq_lens_q"], kwargs["max_length_q"]
        assert starts.dtype == torch.int32 and isinstance(longest, int)
        assert kwargs["cu_seq_lens_k"] is starts and kwargs["max_length_k"] == longest
        received.append((starts.tolist(), longest))
        rows = [sdpa_attention_forward(module, query[:, :, a:b], key[:, :, a:b], value[:, :, a:b], None, is_causal=True,
                                       scaling=kwargs.get("scaling"))[0]
                for a, b in zip(starts[:-1].tolist(), starts[1:].tolist())]
        return torch.cat(rows, 1), None

    monkeypatch.setitem(AttentionInterface._global_mapping, "flash_attention_2", varlen)
    with torch.no_grad():
        padded, _ = response_logprobs(model, *padded_batch(), prompt_index=PROMPT_INDEX)
        model.config._attn_implementation = "flash_attention_2"
        packed, _ = response_logprobs(model, *padded_batch(), prompt_index=PROMPT_INDEX, options=PACKED)
        model.config._attn_implementation = "sdpa"
    torch.testing.assert_close(packed, padded, atol=ATOL, rtol=0)
    # each non-empty row is its prompt (5 or 2 tokens) and its response but the last token, 2 layers
    prompt_of = [5, 5, 5, 2, 2]
    rows = [p + n - 1 for p, n in zip(prompt_of, (4, 1, 6, 3, 2))]
    starts = [0]
    for row in rows:
        starts.append(starts[-1] + row)
    assert received == [(starts, max(rows))] * 2


def test_importing_the_module_registers_no_attention_function():
    """segment_attention is registered by a packed pass, not as a side effect of importing tokenpo.models.logprobs (a
    fresh interpreter: this one has imported it already)."""
    script = ("from transformers import AttentionInterface\n"
              "from transformers.integrations.sdpa_attention import sdpa_attention_forward\n"
              "before = dict(AttentionInterface._global_mapping)\n"
              "import tokenpo.models.logprobs\n"
              "assert AttentionInterface._global_mapping == before\n"
              "assert AttentionInterface()['sdpa'] is sdpa_attention_forward\n")
    subprocess.run([sys.executable, "-c", script], cwd=REPO, env=cli_env(), check=True, timeout=300)


def test_a_packed_pass_registers_its_attention_and_matches_the_padded_pass(model, monkeypatch):
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    monkeypatch.setitem(AttentionInterface._global_mapping, "sdpa", sdpa_attention_forward)  # as on import
    with torch.no_grad():
        padded, _ = response_logprobs(model, *padded_batch(), prompt_index=PROMPT_INDEX)
        assert AttentionInterface()["sdpa"] is sdpa_attention_forward  # an unpacked pass registers nothing
        packed, _ = response_logprobs(model, *padded_batch(), prompt_index=PROMPT_INDEX, options=PACKED)
    assert AttentionInterface()["sdpa"] is segment_attention
    torch.testing.assert_close(packed, padded, atol=ATOL, rtol=0)

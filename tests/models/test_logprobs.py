"""response_logprobs (shared prompt pass, chunked head) against a plain per-sequence forward of the whole text."""

from __future__ import annotations

import pytest
import torch

from support.logprobs import GROUP, PROMPT_INDEX, PROMPTS, RESPONSES, padded_batch
from tokenpo.models.loading import enable_activation_checkpointing
from tokenpo.models.logprobs import PassOptions, activation_checkpointing, left_pad, response_logprobs


def reference(model, temperature=1.0, entropy_grad=False):
    """Each (prompt, response) text alone, unpadded, through the full model: log_softmax + gather, -sum p log p
    (detached unless `entropy_grad`)."""
    length = max(map(len, RESPONSES))
    logp = torch.zeros(len(RESPONSES), length)
    entropy = torch.zeros(len(RESPONSES), length)
    for row, response in enumerate(RESPONSES):
        if not response:
            continue
        prompt = PROMPTS[row // GROUP]
        logits = model(input_ids=torch.tensor([prompt + response])).logits[0].float() / temperature
        # position p predicts token p + 1: the last prompt position predicts the first response token
        step_logits = logits[len(prompt) - 1 : len(prompt) - 1 + len(response)]
        log_probs = torch.log_softmax(step_logits, -1)
        logp[row, : len(response)] = log_probs.gather(-1, torch.tensor(response)[:, None]).squeeze(-1)
        row_entropy = -(log_probs.exp() * log_probs).sum(-1)
        entropy[row, : len(response)] = row_entropy if entropy_grad else row_entropy.detach()
    return logp, entropy


def ours(model, **kwargs):
    return response_logprobs(model, *padded_batch(), prompt_index=PROMPT_INDEX, options=PassOptions(**kwargs))


@pytest.mark.parametrize("chunk_tokens", [1, 7, 1024])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_values_match_full_forward(model, chunk_tokens, temperature):
    with torch.no_grad():
        want_logp, want_entropy = reference(model, temperature)
        logp, entropy = ours(model, temperature=temperature, chunk_tokens=chunk_tokens)
    torch.testing.assert_close(logp, want_logp, atol=1e-5, rtol=0)
    torch.testing.assert_close(entropy, want_entropy, atol=1e-5, rtol=0)
    # padding positions hold exactly 0 and the values are real log-probs / entropies
    mask = padded_batch()[3].bool()
    assert (logp[~mask] == 0).all() and (entropy[~mask] == 0).all()
    assert (logp[mask] < 0).all() and (entropy[mask] > 0).all()


def parameter_grads(model, logp):
    model.zero_grad()
    # distinct weights per position, so a token shifted to a wrong slot changes the gradient
    weights = torch.linspace(0.5, 1.5, logp.numel()).reshape(logp.shape)
    (logp * weights).sum().backward()
    return {name: p.grad.clone() for name, p in model.named_parameters()}


@pytest.mark.parametrize("recompute_head", [False, True])
@pytest.mark.parametrize("chunk_tokens", [1, 7, 1024])
def test_gradients_match_full_forward(model, recompute_head, chunk_tokens):
    want = parameter_grads(model, reference(model)[0])
    logp, entropy = ours(model, chunk_tokens=chunk_tokens, recompute_head=recompute_head)
    assert logp.requires_grad and not entropy.requires_grad
    got = parameter_grads(model, logp)
    assert want.keys() == got.keys()
    for name in want:
        # fp32 sums in another order: an error of about 1e-6 of the gradient's scale (the embedding's reaches 13, so
        # its near-zero entries differ by ~4e-5); a token in a wrong slot moves entries by the scale itself
        scale = max(1.0, float(want[name].abs().max()))
        torch.testing.assert_close(got[name], want[name], atol=1e-5 * scale, rtol=1e-4, msg=name)
    assert any(g.abs().sum() > 0 for g in got.values())


@pytest.mark.parametrize("recompute_head", [False, True])
@pytest.mark.parametrize("chunk_tokens", [1, 7, 1024])
def test_entropy_gradient_matches_autograd_through_the_full_softmax(model, recompute_head, chunk_tokens):
    """entropy_grad: the entropy's parameter gradients equal autograd through each whole text's full softmax
    over the 89-token vocabulary, -sum p log p, on the plain and the recomputed head."""
    want_entropy = reference(model, entropy_grad=True)[1]
    want = parameter_grads(model, want_entropy)
    logp, entropy = ours(model, chunk_tokens=chunk_tokens, recompute_head=recompute_head, entropy_grad=True)
    torch.testing.assert_close(entropy.detach(), want_entropy.detach(), atol=1e-5, rtol=0)
    got = parameter_grads(model, entropy)
    for name in want:
        # fp32 sums in another order: an error of about 1e-6 of the gradient's scale (the embedding's reaches 13, so
        # its near-zero entries differ by ~4e-5); a token in a wrong slot moves entries by the scale itself
        scale = max(1.0, float(want[name].abs().max()))
        torch.testing.assert_close(got[name], want[name], atol=1e-5 * scale, rtol=1e-4, msg=name)
    # the tied embedding (head) and the first layer (through the shared prompt pass) both get a gradient
    first_layer = "model.layers.0.self_attn.q_proj.weight"
    assert got["model.embed_tokens.weight"].abs().sum() > 0 and got[first_layer].abs().sum() > 0
    assert logp.requires_grad


def test_recompute_head_gives_the_same_values_and_entropy(model):
    plain_logp, plain_entropy = ours(model, chunk_tokens=7, recompute_head=False)
    recomputed_logp, recomputed_entropy = ours(model, chunk_tokens=7, recompute_head=True)
    torch.testing.assert_close(recomputed_logp, plain_logp, atol=1e-6, rtol=0)
    torch.testing.assert_close(recomputed_entropy, plain_entropy, atol=1e-6, rtol=0)


def test_gradient_checkpointing_path_matches(model):
    """With activation recomputation the prompts are repeated instead of sharing a KV cache: same numbers."""
    want_logp, want_entropy = reference(model)
    want = parameter_grads(model, want_logp)
    enable_activation_checkpointing(model)
    model.train()
    logp, entropy = ours(model, chunk_tokens=7)
    torch.testing.assert_close(logp, want_logp.detach(), atol=1e-5, rtol=0)
    torch.testing.assert_close(entropy, want_entropy, atol=1e-5, rtol=0)
    got = parameter_grads(model, logp)
    for name in want:
        # fp32 sums in another order: an error of about 1e-6 of the gradient's scale (the embedding's reaches 13, so
        # its near-zero entries differ by ~4e-5); a token in a wrong slot moves entries by the scale itself
        scale = max(1.0, float(want[name].abs().max()))
        torch.testing.assert_close(got[name], want[name], atol=1e-5 * scale, rtol=1e-4, msg=name)


@pytest.mark.filterwarnings("error")
def test_cache_and_checkpointing_checks_warn_nothing(model):
    """Neither the KV-cache keyword (`past_key_values` warns in transformers 5.x) nor the checkpointing check
    (`is_gradient_checkpointing` warns there) raises a deprecation warning."""
    assert not activation_checkpointing(model)
    logp, _ = ours(model)
    assert logp.shape == (len(RESPONSES), max(map(len, RESPONSES)))


def test_activation_checkpointing_is_read_from_the_submodules(model):
    model.model.gradient_checkpointing = True
    assert activation_checkpointing(model)


def test_left_pad_right_aligns_prompts():
    ids, mask = left_pad([[7, 8, 9], [5]], pad_id=0)
    assert ids.tolist() == [[7, 8, 9], [0, 0, 5]]
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1]]


def test_without_entropy(model):
    with torch.no_grad():
        logp, entropy = ours(model, with_entropy=False)
        torch.testing.assert_close(logp, reference(model)[0], atol=1e-5, rtol=0)
    assert entropy is None

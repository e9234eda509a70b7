"""response_logprobs' flags (with_entropy, entropy_grad, recompute_head, and grad on or off) choose what autograd keeps
and what is differentiable, never a bit of the values or gradients: every combination against the plain path (one
head call per chunk, logits kept, the entropy differentiable), bitwise."""

from __future__ import annotations

import itertools

import pytest
import torch
from support.logprobs import PROMPT_INDEX, padded_batch

from tokenpo.models.logprobs import PassOptions, response_logprobs, response_token_hidden_states, token_entropy

TEMPERATURE = 0.7


def plain(model, chunk_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:  # noqa: F811
    """Log-probs and entropy [B, T], both differentiable: each chunk of response positions through the output layer
    once, log-prob = z[target] - logsumexp(z), entropy over the same tempered fp32 logits z."""
    prompt_ids, prompt_mask, response_ids, response_mask = padded_batch()
    hidden, rows, cols = response_token_hidden_states(model, prompt_ids, prompt_mask, response_ids, response_mask,
                                                      PROMPT_INDEX)
    targets = response_ids[rows, cols]
    logp_parts, entropy_parts = [], []
    for lo in range(0, hidden.shape[0], chunk_tokens):
        logits = model.get_output_embeddings()(hidden[lo : lo + chunk_tokens]).float() / TEMPERATURE
        chunk_targets = targets[lo : lo + chunk_tokens]
        logp_parts.append(logits.gather(-1, chunk_targets[:, None]).squeeze(-1) - torch.logsumexp(logits, -1))
        entropy_parts.append(token_entropy(logits))
    zeros = torch.zeros(response_mask.shape)
    return zeros.index_put((rows, cols), torch.cat(logp_parts)), zeros.index_put((rows, cols), torch.cat(entropy_parts))


def gradients(model, loss: torch.Tensor) -> list[torch.Tensor]:  # noqa: F811
    model.zero_grad()
    loss.backward()
    return [p.grad.clone() for p in model.parameters()]


def weighted(values: torch.Tensor, seed: int) -> torch.Tensor:
    # distinct weights per position, so a token in a wrong slot changes the gradient
    return (values * torch.rand(values.shape, generator=torch.Generator().manual_seed(seed))).sum()


FLAGS = list(itertools.product([True, False], repeat=4))


@pytest.mark.parametrize("chunk_tokens", [7, 1024])
@pytest.mark.parametrize("with_entropy, entropy_grad, recompute_head, grad", FLAGS,
                         ids=["-".join(name for name, on in zip(("entropy", "entropy_grad", "recompute", "grad"), f)
                                       if on) or "none" for f in FLAGS])
def test_every_flag_combination_is_the_plain_path_bitwise(model, chunk_tokens, with_entropy,  # noqa: F811
                                                          entropy_grad, recompute_head, grad):
    want_logp, want_entropy = plain(model, chunk_tokens)
    with torch.set_grad_enabled(grad):
        logp, entropy = response_logprobs(
            model, *padded_batch(), prompt_index=PROMPT_INDEX,
            options=PassOptions(temperature=TEMPERATURE, chunk_tokens=chunk_tokens, with_entropy=with_entropy,
                                entropy_grad=entropy_grad, recompute_head=recompute_head))
    assert torch.equal(logp, want_logp.detach())
    assert logp.requires_grad == grad
    if not with_entropy:
        assert entropy is None
    else:
        assert torch.equal(entropy, want_entropy.detach())
        assert entropy.requires_grad == (grad and entropy_grad)
    if not grad:
        return
    differentiable_entropy = with_entropy and entropy_grad
    loss = weighted(logp, 0) + (weighted(entropy, 1) if differentiable_entropy else 0)
    want_loss = weighted(want_logp, 0) + (weighted(want_entropy, 1) if differentiable_entropy else 0)
    got, want = gradients(model, loss), gradients(model, want_loss)
    assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))
    assert any(g.abs().sum() > 0 for g in got)

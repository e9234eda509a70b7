"""Log-probs and entropy of response tokens in one chunked pass.

The decoder runs on every position (prompt + response), but the output layer, log-softmax and entropy
run only on the real response positions, `chunk_tokens` rows at a time: a full-vocabulary fp32 tensor
is never materialised for the whole batch (TRL pushes every prompt, padding and completion position
through the 49k-word head; that is most of its update time on CPU).
"""

from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions that skip left padding, exactly as the sampler saw them."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def token_entropy(logits: torch.Tensor) -> torch.Tensor:
    """H = logsumexp(z) - sum softmax(z) * z over the vocabulary (spec: shared building blocks)."""
    log_z = torch.logsumexp(logits, dim=-1)
    return log_z - (torch.softmax(logits, dim=-1) * logits).sum(-1)


def _head_logp(head: torch.nn.Module, hidden: torch.Tensor, targets: torch.Tensor, temperature: float):
    # the head is called as a module (not through its weight) so ZeRO-3 gathers it
    logits = head(hidden).float() / temperature
    return logits.gather(-1, targets[:, None]).squeeze(-1) - torch.logsumexp(logits, dim=-1), logits


def _chunk_logp(head, hidden, targets, temperature):
    return _head_logp(head, hidden, targets, temperature)[0]


def response_logprobs(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    response_mask: torch.Tensor,
    temperature: float = 1.0,
    chunk_tokens: int = 1024,
    with_entropy: bool = True,
    recompute_head: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs [B, T] (differentiable when grad is enabled) and detached entropy [B, T] of responses.

    `input_ids` is [B, P + T]: left-padded prompts of common length P followed by responses of length T.
    `response_mask` [B, T] marks real response tokens; other positions get 0.
    `recompute_head` re-runs each head chunk in the backward pass instead of keeping its logits
    (trades ~1/3 more head FLOPs for O(chunk) instead of O(tokens x vocab) memory; for 150k vocabularies).
    """
    batch, resp_len = response_mask.shape
    hidden = model.get_decoder()(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids_from_mask(attention_mask),
        use_cache=False,
    ).last_hidden_state
    # position p predicts token p + 1: the response's hidden states start one before it
    start = input_ids.shape[1] - resp_len - 1
    hidden = hidden[:, start : start + resp_len]
    where = response_mask.bool()
    flat_hidden = hidden[where]
    flat_targets = input_ids[:, -resp_len:][where]
    head = model.get_output_embeddings()
    logp_chunks, entropy_chunks = [], []
    for lo in range(0, flat_hidden.shape[0], chunk_tokens):
        h, y = flat_hidden[lo : lo + chunk_tokens], flat_targets[lo : lo + chunk_tokens]
        if recompute_head and torch.is_grad_enabled():
            logp_chunks.append(checkpoint(_chunk_logp, head, h, y, temperature, use_reentrant=False))
            if with_entropy:
                with torch.no_grad():
                    entropy_chunks.append(token_entropy(head(h).float() / temperature))
            continue
        logp, logits = _head_logp(head, h, y, temperature)
        logp_chunks.append(logp)
        if with_entropy:
            entropy_chunks.append(token_entropy(logits.detach()))
    logp = hidden.new_zeros(batch, resp_len, dtype=torch.float32)
    logp = logp.masked_scatter(where, torch.cat(logp_chunks)) if logp_chunks else logp
    entropy = None
    if with_entropy:
        entropy = torch.zeros(batch, resp_len, dtype=torch.float32, device=logp.device)
        if entropy_chunks:
            entropy[where] = torch.cat(entropy_chunks)
    return logp, entropy

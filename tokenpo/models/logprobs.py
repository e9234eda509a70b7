"""Log-probs and entropy of response tokens in one chunked pass.

Two savings over pushing every (prompt + response) row through the whole model:
- each prompt runs once per group and its KV cache is repeated for its G responses (the prompt is
  usually most of the tokens at small G x short answers); gradients flow through the shared prompt;
- the output layer, log-softmax and entropy run only on real response positions, `chunk_tokens` rows at
  a time, so a full-vocabulary fp32 tensor is never materialised for the whole batch.
"""

from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint
from transformers import DynamicCache


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


def response_hidden_states(model, prompt_ids, prompt_mask, response_ids, response_mask, group_size: int):
    """Hidden states [B, T, H] that predict each response token (B = prompts x group_size).

    Prompts [B/G, P] are left-padded, responses [B, T] right-padded. The prompt pass is shared by the G
    responses of its group through a repeated KV cache, unless the model recomputes activations
    (gradient checkpointing cannot run with a cache), in which case prompts are repeated instead.
    """
    decoder = model.get_decoder()
    if getattr(model, "is_gradient_checkpointing", False) and torch.is_grad_enabled():
        prompt_ids = prompt_ids.repeat_interleave(group_size, 0)
        prompt_mask = prompt_mask.repeat_interleave(group_size, 0)
        mask = torch.cat([prompt_mask, response_mask.long()], 1)
        hidden = decoder(input_ids=torch.cat([prompt_ids, response_ids], 1), attention_mask=mask,
                         position_ids=position_ids_from_mask(mask), use_cache=False).last_hidden_state
        return hidden[:, prompt_ids.shape[1] - 1 : -1]
    cache = DynamicCache()
    prompt_hidden = decoder(input_ids=prompt_ids, attention_mask=prompt_mask,
                            position_ids=position_ids_from_mask(prompt_mask), past_key_values=cache,
                            use_cache=True).last_hidden_state[:, -1:]
    if group_size > 1:
        cache.batch_repeat_interleave(group_size)
        prompt_hidden = prompt_hidden.repeat_interleave(group_size, 0)
        prompt_mask = prompt_mask.repeat_interleave(group_size, 0)
    resp_len = response_ids.shape[1]
    positions = prompt_mask.sum(-1, keepdim=True) + torch.arange(resp_len, device=prompt_mask.device)
    response_hidden = decoder(input_ids=response_ids, attention_mask=torch.cat([prompt_mask, response_mask.long()], 1),
                              position_ids=positions, past_key_values=cache, use_cache=True).last_hidden_state
    # the last prompt position predicts response token 0; response position t predicts token t + 1
    return torch.cat([prompt_hidden, response_hidden[:, :-1]], 1)


def response_logprobs(
    model,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    response_ids: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    group_size: int = 1,
    temperature: float = 1.0,
    chunk_tokens: int = 1024,
    with_entropy: bool = True,
    recompute_head: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs [B, T] (differentiable when grad is enabled) and detached entropy [B, T] of responses.

    `response_mask` [B, T] marks real response tokens; other positions get 0.
    `recompute_head` re-runs each head chunk in the backward pass instead of keeping its logits
    (about 1/3 more head FLOPs for O(chunk) instead of O(tokens x vocab) memory; for 150k vocabularies).
    """
    hidden = response_hidden_states(model, prompt_ids, prompt_mask, response_ids, response_mask, group_size)
    where = response_mask.bool()
    flat_hidden = hidden[where]
    flat_targets = response_ids[where]
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
    logp = torch.zeros(response_mask.shape, dtype=torch.float32, device=hidden.device)
    if logp_chunks:
        logp = logp.masked_scatter(where, torch.cat(logp_chunks))
    entropy = None
    if with_entropy:
        entropy = torch.zeros(response_mask.shape, dtype=torch.float32, device=hidden.device)
        if entropy_chunks:
            entropy[where] = torch.cat(entropy_chunks)
    return logp, entropy

"""Rollouts with the policy's own Hugging Face modules and a KV cache.

The G samples of a prompt share its prefill: the prompt batch runs once and its KV cache is repeated
G times, then a plain sampling loop decodes until every row has stopped (or `max_new_tokens`).
A row that stops leaves the batch (its KV cache rows are dropped), so the decode steps after it only pay
for the rows still running: most math answers stop well before the length cap.
The `hf` engine generates with the live policy module, so it has no weights to sync and no memory to release.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from tokenpo.models.logprobs import kv_cache, left_pad, position_ids_from_mask
from tokenpo.models.modes import no_dropout
from tokenpo.rollout.engine import ENGINES, Responses, SamplingParams


def sample_next(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> torch.Tensor:
    """Temperature / nucleus sampling; temperature 0 is greedy.

    Inverse-CDF sampling: one uniform number per row against the cumulative probabilities. It draws from
    the same distribution as torch.multinomial, which on CPU draws an exponential number per vocabulary
    entry (rows x 49k random numbers per token, about as slow as the model's output layer).
    """
    if params.temperature == 0:
        return logits.argmax(-1)
    logits = logits.float()
    probs = torch.softmax(logits if params.temperature == 1 else logits / params.temperature, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        # keep the smallest prefix whose mass reaches top_p (the first token always stays)
        drop = sorted_probs.cumsum(-1) - sorted_probs >= params.top_p
        sorted_probs = sorted_probs.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
    # float64: in float32 a token below half an ulp of the running sum (~3e-8) would get no width at all
    cdf = probs.double().cumsum(-1)
    total = cdf[:, -1:]
    uniform = torch.rand(total.shape, generator=generator, dtype=cdf.dtype, device=cdf.device)
    # the first token whose cumulative mass exceeds u * total has non-zero probability; the target stays
    # below the total even when u * total rounds up to it
    target = torch.minimum(uniform * total, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf, target, right=True).squeeze(-1)


@ENGINES.register("hf")
class HFEngine:
    """The policy's own modules (under ZeRO-3 gathered once per generate call)."""

    def __init__(self, cfg, policy, tokenizer, deepspeed=None) -> None:
        self.policy, self.pad_id, self.deepspeed = policy, tokenizer.pad_token_id, deepspeed

    def generate(self, prompt_ids, params: SamplingParams, generator: torch.Generator) -> Responses:
        if self.deepspeed is None:  # a plain module (evaluation)
            return generate_hf(self.policy, prompt_ids, params, self.pad_id, generator)
        from tokenpo.deepspeed.engine import gathered_for_generation

        with gathered_for_generation(self.policy, self.deepspeed):
            return generate_hf(self.policy.module, prompt_ids, params, self.pad_id, generator)

    def sync_weights(self, policy) -> None:
        """Nothing to do: generate reads the live policy."""

    def sleep(self) -> None:
        """Nothing to release."""

    def wake_up(self) -> None:
        """Nothing to take back."""

    def close(self) -> None:
        """Nothing to free."""


@torch.no_grad()
def generate_hf(model, prompt_ids, params: SamplingParams, pad_id: int, generator: torch.Generator) -> Responses:
    """`params.num_samples` responses per prompt from `model`, in eval mode (no dropout while sampling)."""
    with no_dropout(model):
        return _sample(model, prompt_ids, params, pad_id, generator)


def _sample(model, prompt_ids, params: SamplingParams, pad_id: int, generator: torch.Generator) -> Responses:
    device = next(model.parameters()).device
    ids, mask = left_pad(prompt_ids, pad_id)
    ids, mask = ids.to(device), mask.to(device)
    samples_per_prompt = params.num_samples  # G
    if not params.share_prefill:
        ids, mask = ids.repeat_interleave(samples_per_prompt, 0), mask.repeat_interleave(samples_per_prompt, 0)
    cache = DynamicCache()
    out = model(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask),
                **kv_cache(model, cache), use_cache=True, logits_to_keep=1)
    logits = out.logits[:, -1]
    if params.share_prefill and samples_per_prompt > 1:
        cache.batch_repeat_interleave(samples_per_prompt)
        logits = logits.repeat_interleave(samples_per_prompt, 0)
        mask = mask.repeat_interleave(samples_per_prompt, 0)
    rows = logits.shape[0]
    stop = torch.tensor(params.stop_token_ids, dtype=torch.long, device=device)
    tokens = torch.full((rows, params.max_new_tokens), pad_id, dtype=torch.long, device=device)
    lengths = torch.zeros(rows, dtype=torch.long, device=device)
    running = torch.arange(rows, device=device)  # the rows still decoding; `logits`, `mask`, cache follow them
    position = mask.sum(-1)
    for step in range(params.max_new_tokens):
        next_ids = sample_next(logits, params, generator)
        tokens[running, step] = next_ids
        lengths[running] += 1
        going = ~torch.isin(next_ids, stop)
        if step + 1 == params.max_new_tokens or not bool(going.any()):
            break
        if not bool(going.all()):
            keep = going.nonzero().squeeze(-1)
            running, next_ids, mask, position = running[keep], next_ids[keep], mask[keep], position[keep]
            cache.batch_select_indices(keep)
        mask = torch.cat([mask, mask.new_ones(len(running), 1)], dim=1)
        out = model(input_ids=next_ids[:, None], attention_mask=mask, position_ids=position[:, None],
                    **kv_cache(model, cache), use_cache=True)
        position = position + 1
        logits = out.logits[:, -1]
    # a row stopped iff its last token is a stop token; the others hit max_new_tokens
    stopped = torch.isin(tokens.gather(1, (lengths - 1)[:, None]).squeeze(1), stop).tolist()
    return Responses(
        token_ids=[row[:n] for row, n in zip(tokens.tolist(), lengths.tolist())],
        truncated=[not s for s in stopped],
    )

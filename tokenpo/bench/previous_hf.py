"""The `hf` engine's decode loop and sampler as they were before the two-level inverse CDF and the stop check every
rollout.hf_stop_check_every tokens (docs/performance.md): the baseline of scripts/bench_hf_sampling.py and the
exact reference of tests/rollout/test_hf_sampling.py (same generator, same tokens). Not used by training."""

from __future__ import annotations

import torch

from tokenpo.models.modes import no_dropout
from tokenpo.rollout.engine import Responses, SamplingParams
from tokenpo.rollout.hf import decode_step, prefill, sampling_probs


def previous_sample_next(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> torch.Tensor:
    """tokenpo.rollout.hf.sample_next before: one float64 cumulative sum over the vocabulary per row."""
    if params.temperature == 0:
        return logits.argmax(-1)
    cdf = sampling_probs(logits, params).double().cumsum(-1)
    total = cdf[:, -1:]
    uniform = torch.rand(total.shape, generator=generator, dtype=cdf.dtype, device=cdf.device)
    target = torch.minimum(uniform * total, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf, target, right=True).squeeze(-1)


@torch.no_grad()
def previous_generate_hf(model, prompt_ids, params: SamplingParams, pad_id: int,
                         generator: torch.Generator) -> Responses:
    """tokenpo.rollout.hf.generate_hf before: the host checks `going` every token and drops stopped rows at once."""
    with no_dropout(model):
        device = next(model.parameters()).device
        cache, logits, mask = prefill(model, prompt_ids, params, pad_id, device)
        rows = logits.shape[0]
        stop = torch.tensor(params.stop_token_ids, dtype=torch.long, device=device)
        tokens = torch.full((rows, params.max_new_tokens), pad_id, dtype=torch.long, device=device)
        lengths = torch.zeros(rows, dtype=torch.long, device=device)
        running = torch.arange(rows, device=device)
        position = mask.sum(-1)
        for step in range(params.max_new_tokens):
            next_ids = previous_sample_next(logits, params, generator)
            tokens[running, step] = next_ids
            lengths[running] += 1
            going = ~torch.isin(next_ids, stop)
            if step + 1 == params.max_new_tokens or not bool(going.any()):
                break
            if not bool(going.all()):
                keep = going.nonzero().squeeze(-1)
                running, next_ids, mask, position = running[keep], next_ids[keep], mask[keep], position[keep]
                cache.batch_select_indices(keep)
            logits, mask, position = decode_step(model, cache, next_ids, mask, position)
        stopped = torch.isin(tokens.gather(1, (lengths - 1)[:, None]).squeeze(1), stop).tolist()
        return Responses(token_ids=[row[:n] for row, n in zip(tokens.tolist(), lengths.tolist())],
                         truncated=[not s for s in stopped])

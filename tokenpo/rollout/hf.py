"""Rollouts with the policy's own Hugging Face modules and a KV cache.

The G samples of a prompt share its prefill: the prompt batch runs once and its KV cache is repeated
G times, then a plain sampling loop decodes until every row has stopped (or `max_new_tokens`).
A row that stops is masked on the device (its later tokens are not recorded) and leaves the batch (its KV cache
rows are dropped) at the next host check, every `rollout.hf_stop_check_every` decode steps: the decode steps after
it only pay for the rows still running (most math answers stop well before the length cap), while a GPU is not
stalled by a host sync every token.
The `hf` engine generates with the live policy module, so it has no weights to copy and no memory to release.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from tokenpo.models.logprobs import kv_cache, left_pad, position_ids_from_mask
from tokenpo.models.modes import no_dropout
from tokenpo.rollout.engine import ENGINES, Responses, SamplingParams
from tokenpo.models.published import Published
from tokenpo.rollout.generator import AnsweredNow

# vocabulary entries per block of the two-level inverse CDF (sample_with_uniform)
SAMPLING_BLOCK = 256
# rollout.hf_stop_check_every's null: on CPU a host check costs nothing and dropping a stopped row at once saves its
# compute; on a GPU each check waits for the queued kernels, so the CPU stops launching ahead
STOP_CHECK_EVERY_CPU, STOP_CHECK_EVERY_GPU = 1, 16
# probabilities converted to float64 at a time for the block sums (whole rows, at least one): on CPU 4 MiB, which
# stays in the allocator's heap; on a GPU 128 MiB, few enough launches and a fixed peak however many rows sample
CPU_SUM_CHUNK, GPU_SUM_CHUNK = 2**19, 2**24


def sample_next(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> torch.Tensor:
    """Temperature / nucleus sampling of one token per row of `logits` [R, V]; temperature 0 is greedy.

    One float64 uniform number per row from `generator` (none when greedy), then `sample_with_uniform`. It draws
    from the same distribution as torch.multinomial, which on CPU draws an exponential number per vocabulary entry
    (rows x 49k random numbers per token, about as slow as the model's output layer).
    """
    if params.temperature == 0:
        return logits.argmax(-1)
    uniform = torch.rand(logits.shape[0], generator=generator, dtype=torch.float64, device=logits.device)
    return sample_with_uniform(logits, params, uniform)


def sample_with_uniform(logits: torch.Tensor, params: SamplingParams, uniform: torch.Tensor | None) -> torch.Tensor:
    """The token of each row of `logits` [R, V] that the uniform number of that row ([R] float64 in [0, 1); None
    when greedy) picks by inverse CDF: the first token whose cumulative probability exceeds u x total."""
    if params.temperature == 0:
        return logits.argmax(-1)
    return inverse_cdf(sampling_probs(logits, params), uniform)


def sampling_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The distribution sampled from: softmax(logits / temperature) [R, V] in fp32, cut to the nucleus (top_p)."""
    logits = logits.float()
    probs = torch.softmax(logits if params.temperature == 1 else logits / params.temperature, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        # keep the smallest prefix whose mass reaches top_p (the first token always stays)
        drop = sorted_probs.cumsum(-1) - sorted_probs >= params.top_p
        sorted_probs = sorted_probs.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
    return probs


def _below(value: torch.Tensor) -> torch.Tensor:
    """The largest float below `value` (> 0)."""
    return torch.nextafter(value, torch.zeros_like(value))


def _block_sums(probs: torch.Tensor, whole: int, block: int) -> torch.Tensor:
    """Float64 sums [R, ceil(V / block)] of the blocks of `probs` [R, V], whose first `whole` entries fill whole
    blocks: the fp32 entries converted, then summed (a float64 sum over a float32 tensor converts it too, slower)."""
    sums = probs[:, :whole].double().view(probs.shape[0], -1, block).sum(-1)
    if whole < probs.shape[1]:  # a last partial block sums on its own
        sums = torch.cat([sums, probs[:, whole:].double().sum(-1, keepdim=True)], dim=1)
    return sums


def inverse_cdf(probs: torch.Tensor, uniform: torch.Tensor, block: int | None = None) -> torch.Tensor:
    """The first index of each row of `probs` [R, V] (>= 0, fp32, any total > 0) whose cumulative sum exceeds
    uniform x total, in two levels: the block of `block` entries (None: SAMPLING_BLOCK) from the cumulative block
    sums, then the entry inside that block. The same pick as one float64 cumulative sum over the vocabulary (up to
    float64 rounding at a boundary) without one: float64 only over the [R, V / block] block sums and the
    [R, block] chosen blocks (fp32 block sums would differ from it about once in 10^4 draws at 49k tokens).

    In float64 because in float32 a token below half an ulp of the running sum (~3e-8) would get no width at all.
    A token of probability 0 is never picked: both searches return the first cumulative sum above the target, and
    each target stays below its total even where u x total rounds up to it.
    """
    block = block or SAMPLING_BLOCK
    rows, vocab = probs.shape
    whole = vocab // block * block
    # a few rows at a time: on CPU a float64 copy of [32, 152k] probabilities is a fresh 39 MB allocation whose page
    # faults cost more than the sum (here 33 ms against 2 ms in chunks of 2^19 entries)
    step = max(1, (CPU_SUM_CHUNK if probs.device.type == "cpu" else GPU_SUM_CHUNK) // vocab)
    cumulative = torch.cat([_block_sums(probs[start:start + step], whole, block)
                            for start in range(0, rows, step)]).cumsum(-1)
    total = cumulative[:, -1:]
    target = torch.minimum(uniform[:, None] * total, _below(total))
    chosen = torch.searchsorted(cumulative, target, right=True)  # [R, 1]; its sum is > 0
    before = cumulative.gather(-1, (chosen - 1).clamp(min=0)).masked_fill(chosen == 0, 0.0)
    index = chosen * block + torch.arange(block, device=probs.device)  # [R, block]
    inside = probs.gather(-1, index.clamp(max=vocab - 1)).double()
    if whole < vocab:
        inside = inside.masked_fill(index >= vocab, 0.0)
    inside = inside.cumsum(-1)
    # the block's own cumulative sum may end a rounding below its sum in `cumulative`: stay below it
    rest = torch.minimum((target - before).clamp(min=0), _below(inside[:, -1:]))
    return (chosen * block + torch.searchsorted(inside, rest, right=True)).squeeze(-1)


@ENGINES.register("hf")
class HFEngine(AnsweredNow):
    """The policy's own modules, lent by the published version (under ZeRO-3 gathered once per sampling call)."""

    def __init__(self, cfg, tokenizer, published: Published, device: torch.device) -> None:
        self.published, self.device, self.answers = published, device, {}
        self.pad_id, self.stop_check_every = tokenizer.pad_token_id, cfg.hf_stop_check_every

    def load(self, published: Published) -> None:
        """Nothing to copy: sampling reads the live module the version lends."""
        self.published = published

    def sample(self, prompt_ids, params: SamplingParams, rng: torch.Generator) -> Responses:
        with self.published.module() as module:
            return generate_hf(module, prompt_ids, params, self.pad_id, rng, self.stop_check_every)

    def sleep(self) -> None:
        """Nothing to release."""

    def wake_up(self) -> None:
        """Nothing to take back."""

    def close(self) -> None:
        """Nothing to free."""


def stop_check_every(value: int | None, device: torch.device) -> int:
    """rollout.hf_stop_check_every on `device`, its null resolved."""
    if value is not None:
        return value
    return STOP_CHECK_EVERY_CPU if device.type == "cpu" else STOP_CHECK_EVERY_GPU


@torch.no_grad()
def generate_hf(model, prompt_ids, params: SamplingParams, pad_id: int, generator: torch.Generator,
                check_every: int | None = None) -> Responses:
    """`params.num_samples` responses per prompt from `model`, in eval mode (no dropout while sampling); the host
    checks for stopped rows every `check_every` decode steps (rollout.hf_stop_check_every; None: the device's)."""
    with no_dropout(model):
        return _sample(model, prompt_ids, params, pad_id, generator, check_every)


def prefill(model, prompt_ids, params: SamplingParams, pad_id: int,
            device: torch.device) -> tuple[DynamicCache, torch.Tensor, torch.Tensor]:
    """The prompts' forward pass, each prompt once and its cache repeated for its G output rows (share_prefill), or
    every output row its own: (the cache, the next-token logits [R, V] and the attention mask [R, L] per output
    row, G rows per prompt in order)."""
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
    return cache, logits, mask


def decode_step(model, cache: DynamicCache, next_ids: torch.Tensor, mask: torch.Tensor,
                position: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One token per row through the model with its cache: (the next logits [R, V], the mask and the positions one
    longer)."""
    mask = torch.cat([mask, mask.new_ones(len(next_ids), 1)], dim=1)
    out = model(input_ids=next_ids[:, None], attention_mask=mask, position_ids=position[:, None],
                **kv_cache(model, cache), use_cache=True)
    return out.logits[:, -1], mask, position + 1


def _sample(model, prompt_ids, params: SamplingParams, pad_id: int, generator: torch.Generator,
            check_every: int | None = None) -> Responses:
    device = next(model.parameters()).device
    check_every = stop_check_every(check_every, device)
    cache, logits, mask = prefill(model, prompt_ids, params, pad_id, device)
    rows = logits.shape[0]
    greedy = params.temperature == 0
    stop = torch.tensor(params.stop_token_ids, dtype=torch.long, device=device)
    tokens = torch.full((rows, params.max_new_tokens), pad_id, dtype=torch.long, device=device)
    # the sampled tokens' log-probs under the sampling temperature (the behaviour policy's, for off-policy corrections)
    logprobs = torch.zeros((rows, params.max_new_tokens), dtype=torch.float32, device=device) \
        if params.logprobs else None
    lengths = torch.zeros(rows, dtype=torch.long, device=device)
    # the batch's rows: `running` their rows of the output, `going` whether each still decodes (a row that stopped
    # stays, masked, until the next host check drops it); `logits`, `mask`, `position` and the cache follow them
    running = torch.arange(rows, device=device)
    going = torch.ones(rows, dtype=torch.bool, device=device)
    position = mask.sum(-1)
    for step in range(params.max_new_tokens):
        # one uniform number per output row every step, used by the rows still in the batch: a row's tokens do not
        # depend on when the others left it (nor on check_every)
        uniform = None if greedy else torch.rand(rows, generator=generator, dtype=torch.float64, device=device)
        next_ids = sample_with_uniform(logits, params, None if greedy else uniform[running])
        # a stopped row's length stays: what it writes past it is never read
        tokens[running, step] = next_ids
        if logprobs is not None:
            logprobs[running, step] = sampled_logprob(logits, next_ids, params.temperature)
        lengths[running] += going
        going = going & ~torch.isin(next_ids, stop)
        if step + 1 == params.max_new_tokens:
            break
        if (step + 1) % check_every == 0:  # the host waits for the device here only
            keep = going.nonzero().squeeze(-1)
            if len(keep) == 0:
                break
            if len(keep) < len(running):
                running, next_ids, mask, position, going = (
                    running[keep], next_ids[keep], mask[keep], position[keep], going[keep])
                cache.batch_select_indices(keep)
        logits, mask, position = decode_step(model, cache, next_ids, mask, position)
    # a row stopped iff its last token is a stop token; the others hit max_new_tokens
    stopped = torch.isin(tokens.gather(1, (lengths - 1)[:, None]).squeeze(1), stop).tolist()
    counts = lengths.tolist()
    return Responses(
        token_ids=[row[:n] for row, n in zip(tokens.tolist(), counts)],
        truncated=[not s for s in stopped],
        logprobs=None if logprobs is None else [row[:n] for row, n in zip(logprobs.tolist(), counts)],
    )


def sampled_logprob(logits: torch.Tensor, token_ids: torch.Tensor, temperature: float) -> torch.Tensor:
    """[R] log-prob of each row's sampled token under softmax(logits / temperature), as the trainer scores it
    (temperature 0, greedy, as 1; top_p's renormalisation is not applied, as the trainer's log-probs do not)."""
    scaled = logits.float() / (temperature or 1.0)
    return scaled.gather(-1, token_ids[:, None]).squeeze(-1) - torch.logsumexp(scaled, -1)

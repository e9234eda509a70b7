"""Log-probs and entropy of response tokens in one chunked pass.

Three savings over pushing every (prompt + response) row through the whole model (docs/performance.md):
- each prompt runs once per group and its KV cache serves its G responses (the prompt is usually most of
  the tokens at small G x short answers); gradients flow through the shared prompt;
- responses run in buckets of similar length, so a 9-token answer is not padded to the 128 tokens of the
  longest one (at 8 x 8 x 128 on arithmetic, padding was ~60% of the tokens); the last response token,
  which predicts nothing, is not run at all;
- the output layer, log-softmax and entropy run only on real response positions, `chunk_tokens` rows at
  a time, so a full-vocabulary fp32 tensor is never materialised for the whole batch.

`packed` (PassOptions; trainer.pack_sequences) instead concatenates the micro-batch into one sequence, no padding at
all. Under `sdpa` each prompt runs once, followed by its rows' responses, each attending to its prompt and to itself
(`segment_attention`, registered with transformers' AttentionInterface as `sdpa` by the first packed pass, not on
import: never an [S, S] mask over the whole pass, which SDPA would also convert to the training dtype in every
layer). Under eager or flash-attention each row carries its own prompt, positions restarting per row, and the
attention stays inside each row (transformers' block-diagonal mask from the position ids for eager, flash-attention's
varlen path).

`lockstep` (ZeRO-3 on several processes) makes every rank call the same modules in the same order whatever its
lengths: under ZeRO-3 every call of a partitioned module gathers its parameters with collectives, in the forward and
again in the backward, so a rank that calls a module once more than another, or in another order, waits for it until
the process group's timeout (DeepSpeed issue #7998). The passes whose call count depends on the lengths run as many
calls as the rank that needs the most (`agreed_count`: one all-reduce of the count): the decoder over response buckets
and the output layer over chunks of response tokens. Each such call runs the same operations on every rank, kept or
not (a bucket past a rank's own runs its first row and keeps nothing; a bucket of one-token answers runs the decoder
too; a chunk past a rank's tokens is empty), so that the graphs differ in sizes only and the backward, which follows
the graph, meets the modules in the same order. Packed passes and passes under activation checkpointing call the
decoder once whatever the lengths.

The trainer runs a pass as the model's forward (`with_response_pass`), so that DeepSpeed's engine and hooks run
around it as around any forward.
"""

from __future__ import annotations

import functools
import inspect
import itertools
import types
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed
from torch.utils.checkpoint import checkpoint
from transformers import AttentionInterface, DynamicCache
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from tokenpo.models.config import is_flash_attention
from tokenpo.models.lora import is_lora


def left_pad(prompt_ids: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, attention mask) [B, P] of token-id rows right-aligned to the longest one, as the sampler and the
    trainer both lay prompts out."""
    width = max(len(p) for p in prompt_ids)
    ids = torch.full((len(prompt_ids), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompt_ids), width), dtype=torch.long)
    for row, prompt in enumerate(prompt_ids):
        ids[row, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
        mask[row, width - len(prompt) :] = 1
    return ids, mask


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions that skip left padding, exactly as the sampler saw them."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


@functools.cache
def _cache_keyword(module_type: type) -> str:
    parameters = inspect.signature(module_type.forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"


def kv_cache(module: torch.nn.Module, cache: DynamicCache) -> dict[str, DynamicCache]:
    """The keyword argument that hands `cache` to `module`'s forward: recent transformers name it `cache` and
    warn on `past_key_values` (deprecated), which is the only name older releases (>= 4.46) know. A PEFT model
    hands its keyword arguments to the model it wraps, whose forward decides."""
    return {_cache_keyword(type(module.get_base_model() if is_lora(module) else module)): cache}


def activation_checkpointing(model: torch.nn.Module) -> bool:
    """Whether gradient (activation) checkpointing is on in any submodule; what transformers'
    `is_gradient_checkpointing` computes, without its deprecation warning in recent releases."""
    return any(getattr(module, "gradient_checkpointing", False) for module in model.modules())


def token_entropy(logits: torch.Tensor) -> torch.Tensor:
    """H = logsumexp(z) - sum softmax(z) * z over the vocabulary (spec: shared building blocks)."""
    log_z = torch.logsumexp(logits, dim=-1)
    return log_z - (torch.softmax(logits, dim=-1) * logits).sum(-1)


@dataclass(frozen=True)
class PackedGroup:
    """One prompt of a packed pass and the rows that continue it: `prompt` tokens, then each row's `branches` tokens
    (its response but the last token), each attending to the prompt and to itself."""

    prompt: int
    branches: tuple[int, ...]


def segment_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling: float | None = None,
                      **kwargs):
    """transformers' `sdpa` attention, but for a packed pass (`packed_groups` given: its layout, PackedGroup's in
    sequence order): each prompt causally over itself, each branch over its prompt and causally over itself, nothing
    else; no [S, S] mask over the pass (which SDPA would also convert to the training dtype in every layer). Queries
    [1, heads, S, d], keys and values [1, kv heads, S, d]; the output as transformers' attention functions give it,
    [1, S, heads, d]."""
    groups = kwargs.pop("packed_groups", None)
    if groups is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    repeat = getattr(module, "num_key_value_groups", 1)
    if repeat > 1:  # grouped-query attention: each key/value head serves `repeat` query heads
        key, value = key.repeat_interleave(repeat, 1), value.repeat_interleave(repeat, 1)
    dropout = dropout if module.training else 0.0

    def attend(q, k, v, **mask):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=dropout, scale=scaling, **mask)

    parts, start = [], 0
    for group in groups:
        prompt = slice(start, start + group.prompt)
        parts.append(attend(query[:, :, prompt], key[:, :, prompt], value[:, :, prompt], is_causal=True))
        start = prompt.stop
        for size in group.branches:
            branch = slice(start, start + size)
            keys = torch.cat([key[:, :, prompt], key[:, :, branch]], 2)
            values = torch.cat([value[:, :, prompt], value[:, :, branch]], 2)
            # branch token t sees the whole prompt and branch tokens 0..t
            visible = torch.ones(size, group.prompt + size, dtype=torch.bool, device=query.device).tril(group.prompt)
            parts.append(attend(query[:, :, branch], keys, values, attn_mask=visible))
            start = branch.stop
    return torch.cat(parts, 2).transpose(1, 2).contiguous(), None


def register_segment_attention() -> None:
    """`segment_attention` registered with transformers' AttentionInterface as `sdpa` itself: the same function
    without `packed_groups`, so no model config changes (a checkpointed layer recomputes with the keyword arguments of
    its forward, and every other caller is unaffected). Process-wide, so done by the first packed pass that needs it
    (not on import); again is a no-op."""
    if AttentionInterface()["sdpa"] is not segment_attention:
        AttentionInterface.register("sdpa", segment_attention)


@dataclass
class PassTokens:
    """What the decoder passes of `response_logprobs` ran, summed over calls: `fed` token positions (padding
    included) and the `real` ones among them (prompt and response tokens); 1 − real / fed is the padding fraction."""

    fed: int = 0
    real: int = 0

    def add(self, fed: int, real: int) -> None:
        self.fed += int(fed)
        self.real += int(real)


@dataclass(frozen=True)
class PassOptions:
    """How `response_logprobs` runs a pass (the trainer's from PolicySettings and the pass's kind)."""

    packed: bool = False  # one padding-free sequence per micro-batch (trainer.pack_sequences)
    # the same decoder and output-layer calls on every rank of the process group (module docstring)
    lockstep: bool = False
    temperature: float = 1.0  # log-probs and entropy of logits / temperature
    chunk_tokens: int = 1024  # output-layer rows computed at a time
    with_entropy: bool = True
    # the entropy differentiable through each head chunk's full softmax (an entropy-regularised loss); else a value
    # only, for which autograd keeps nothing
    entropy_grad: bool = False
    # each head chunk re-run in the backward instead of keeping its logits: about 1/3 more head FLOPs for O(chunk)
    # instead of O(tokens x vocab) memory (150k vocabularies); with entropy_grad its entropy is recomputed with it
    recompute_head: bool = False


@dataclass(frozen=True)
class ChunkLogprobs:
    """One head chunk's log-probs [n] of its target tokens and their entropies [n] (None when not asked for)."""

    logp: torch.Tensor
    entropy: torch.Tensor | None


# (head, hidden [n, H], targets [n], temperature) -> the chunk's log-probs and entropies
ChunkHead = Callable[[torch.nn.Module, torch.Tensor, torch.Tensor, float], ChunkLogprobs]


def _tempered_logits(head: torch.nn.Module, hidden: torch.Tensor, temperature: float) -> torch.Tensor:
    # the head is called as a module (not through its weight) so ZeRO-3 gathers it
    return head(hidden).float() / temperature


def _target_logp(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return logits.gather(-1, targets[:, None]).squeeze(-1) - torch.logsumexp(logits, dim=-1)


def logp_only(head: torch.nn.Module, hidden: torch.Tensor, targets: torch.Tensor,
              temperature: float) -> ChunkLogprobs:
    return ChunkLogprobs(_target_logp(_tempered_logits(head, hidden, temperature), targets), None)


def logp_and_entropy(head: torch.nn.Module, hidden: torch.Tensor, targets: torch.Tensor,
                     temperature: float) -> ChunkLogprobs:
    """The entropy differentiable through the chunk's full softmax (an entropy-regularised loss)."""
    logits = _tempered_logits(head, hidden, temperature)
    return ChunkLogprobs(_target_logp(logits, targets), token_entropy(logits))


def logp_and_detached_entropy(head: torch.nn.Module, hidden: torch.Tensor, targets: torch.Tensor,
                              temperature: float) -> ChunkLogprobs:
    """The entropy as a value only: computed from detached logits, so autograd keeps nothing for it."""
    logits = _tempered_logits(head, hidden, temperature)
    return ChunkLogprobs(_target_logp(logits, targets), token_entropy(logits.detach()))


def recomputed(chunk_head: ChunkHead) -> ChunkHead:
    """`chunk_head` re-run in the backward pass instead of keeping its logits (non-reentrant checkpoint: it stops
    re-running once logp's saved tensors are back, so a detached entropy is not recomputed)."""
    return functools.partial(checkpoint, chunk_head, use_reentrant=False)


def chunk_head_function(with_entropy: bool, entropy_grad: bool, recompute_head: bool,
                        grad_enabled: bool) -> ChunkHead:
    """The per-chunk head function the flags ask for: which entropy (none, a value, differentiable), and whether
    the backward pass recomputes the chunk. Without grad the entropy is a value and nothing is recomputed."""
    if not with_entropy:
        chunk_head = logp_only
    elif entropy_grad and grad_enabled:
        chunk_head = logp_and_entropy
    else:
        chunk_head = logp_and_detached_entropy
    return recomputed(chunk_head) if recompute_head and grad_enabled else chunk_head


def agreed_count(count: int, lockstep: bool, device: torch.device) -> int:
    """`count` calls of some module on this rank; `lockstep` (in a process group): the group's largest count, by one
    all-reduce, so that every rank makes as many."""
    if not (lockstep and torch.distributed.is_initialized()):
        return count
    agreed = torch.tensor([count], dtype=torch.long, device=device)
    torch.distributed.all_reduce(agreed, op=torch.distributed.ReduceOp.MAX)
    return int(agreed)


def head_chunks(tokens: int, chunk_tokens: int, lockstep: bool, device: torch.device) -> list[slice]:
    """The output layer's chunks of a pass over `tokens` response tokens: `chunk_tokens` rows each, the last one
    shorter; `lockstep`: as many as the rank with the most tokens needs (agreed_count), the ones past this rank's
    tokens empty, so that every rank calls the head, and gathers its parameters under ZeRO-3, as often in the forward
    and in the backward."""
    count = agreed_count(-(-tokens // chunk_tokens), lockstep, device)
    return [slice(lo, lo + chunk_tokens) for lo in range(0, count * chunk_tokens, chunk_tokens)]


def _scatter(chunks: list[torch.Tensor], rows: torch.Tensor, cols: torch.Tensor, shape: torch.Size,
             device: torch.device) -> torch.Tensor:
    """[B, T] fp32 zeros holding `chunks` (concatenated) at (rows, cols); differentiable in the chunks."""
    out = torch.zeros(shape, dtype=torch.float32, device=device)
    return out.index_put((rows, cols), torch.cat(chunks)) if chunks else out


def length_buckets(lengths: list[int], overhead_tokens: int = 32) -> list[list[int]]:
    """Rows (length > 0) split into buckets of similar length; each bucket is padded to its own longest row.

    Rows are sorted by length and cut where it minimises the padded tokens plus `overhead_tokens` per bucket
    (a decoder call costs about that much whatever its size): an exact dynamic program over the sorted order.
    """
    order = sorted((row for row, n in enumerate(lengths) if n > 0), key=lambda row: lengths[row])
    best, cut = [0] + [float("inf")] * len(order), [0] * (len(order) + 1)
    for end in range(1, len(order) + 1):
        for start in range(end):
            cost = best[start] + (end - start) * lengths[order[end - 1]] + overhead_tokens
            if cost < best[end]:
                best[end], cut[end] = cost, start
    buckets, end = [], len(order)
    while end > 0:
        buckets.append(order[cut[end] : end])
        end = cut[end]
    return buckets[::-1]


def _repeated_prompt_hidden(model, prompt_ids, prompt_mask, response_ids, response_mask, prompt_index,
                            tokens: PassTokens):
    """Hidden states [B, T, H] predicting each response token, each row's prompt repeated for it in one pass
    (gradient checkpointing recomputes activations and cannot run with a KV cache)."""
    prompt_ids, prompt_mask = prompt_ids[prompt_index], prompt_mask[prompt_index]
    mask = torch.cat([prompt_mask, response_mask.long()], 1)
    tokens.add(mask.numel(), mask.sum())
    hidden = model.get_decoder()(input_ids=torch.cat([prompt_ids, response_ids], 1), attention_mask=mask,
                                 position_ids=position_ids_from_mask(mask), use_cache=False).last_hidden_state
    return hidden[:, prompt_ids.shape[1] - 1 : -1]


def per_row(prompt_tensor: torch.Tensor, prompt_index: torch.Tensor) -> torch.Tensor:
    """`prompt_tensor`'s entry of each row's prompt (`prompt_index` repeats a prompt for each of its rows).
    index_select, not `prompt_tensor[prompt_index]`: the backward of indexing sums the G rows' gradients with
    parallel atomic adds on CPU (index_put_ accumulate above 32768 elements, 2+ threads), in an order that depends on
    thread timing, so identical runs under load differed from the first update on (issue 28); index_select's backward
    (index_add_) adds them in row order on CPU, and is ~4x faster here. On CUDA both use atomics (not bitwise
    deterministic)."""
    return prompt_tensor.index_select(0, prompt_index)


def _bucket_hidden(decoder, prompt_last, prompt_kv, prompt_mask, response_embeds, response_mask, rows,
                   length: int):
    """Hidden states [rows, length, H] predicting response tokens 0..length-1 of `rows` (`prompt_last`, `prompt_kv`,
    `prompt_mask` are already indexed per row); length >= 2."""
    cache = DynamicCache()
    for layer, (keys, values) in enumerate(prompt_kv):
        cache.update(keys, values, layer)
    # the last response token predicts nothing: the decoder runs on tokens 0..length-2 only
    mask = torch.cat([prompt_mask, response_mask[rows, : length - 1].long()], 1)
    positions = prompt_mask.sum(-1, keepdim=True) + torch.arange(length - 1, device=prompt_mask.device)
    hidden = decoder(inputs_embeds=response_embeds[rows, : length - 1], attention_mask=mask, position_ids=positions,
                     **kv_cache(decoder, cache), use_cache=True).last_hidden_state
    # the last prompt position predicts response token 0; response position t predicts token t + 1
    return torch.cat([prompt_last[:, None], hidden], 1)


def _packed_hidden(decoder, prompt_ids, prompt_mask, response_ids, response_mask, prompt_index, tokens: PassTokens):
    """(hidden [N, H], rows [N], cols [N]) from one pass over the micro-batch packed into a single sequence, no
    padding. Under `sdpa` each prompt runs once, followed by its rows' responses (but their last tokens, which
    predict nothing), each response positioned after its prompt and attending to it (`segment_attention`). Under
    flash-attention (its varlen kernels) or eager (transformers' packed-sequence mask) each row is its prompt and
    response, positions restarting at 0, attention kept inside the row by the restarting positions; flash-attention
    is handed the rows' boundaries (`varlen_kwargs`), which transformers would otherwise derive from the positions in
    every layer, each time waiting for the device."""
    lengths = response_mask.sum(-1).long().tolist()
    prompt_lengths = prompt_mask.sum(-1).long().tolist()
    width = prompt_ids.shape[1]
    shared = decoder.config._attn_implementation == "sdpa"
    order = sorted((row for row, n in enumerate(lengths) if n > 0), key=lambda row: int(prompt_index[row]))
    pieces, positions, layout, targets, rows, cols, offset = [], [], [], [], [], [], 0
    for prompt, members in itertools.groupby(order, key=lambda row: int(prompt_index[row])):
        members = list(members)
        prompt_length, prompt_tokens = prompt_lengths[prompt], prompt_ids[prompt, width - prompt_lengths[prompt] :]
        branches = []
        if shared:  # the prompt once
            pieces.append(prompt_tokens)
            positions.append(torch.arange(prompt_length))
            last, offset = offset + prompt_length - 1, offset + prompt_length
        for row in members:
            length = lengths[row]
            if not shared:  # the prompt with each row
                pieces.append(prompt_tokens)
                positions.append(torch.arange(prompt_length))
                last, offset = offset + prompt_length - 1, offset + prompt_length
            pieces.append(response_ids[row, : length - 1])
            positions.append(torch.arange(prompt_length, prompt_length + length - 1))
            branches.append(length - 1)
            # the prompt's last position predicts response token 0, response position t - 1 token t
            targets.append(torch.cat([torch.tensor([last]), torch.arange(offset, offset + length - 1)]))
            rows.append(torch.full((length,), row))
            cols.append(torch.arange(length))
            offset += length - 1
        layout.append(PackedGroup(prompt_length, tuple(branches)))
    device = response_ids.device
    if not pieces:  # no token to predict: one call on the first prompt token all the same (ZeRO-3: every rank calls)
        pieces, positions, layout = [prompt_ids[0, -1:]], [torch.zeros(1, dtype=torch.long)], [PackedGroup(1, ())]
    tokens.add(offset, offset)
    if shared:
        register_segment_attention()
        extra = {"packed_groups": layout}
    elif is_flash_attention(decoder.config._attn_implementation):
        extra = varlen_kwargs([len(piece) for piece in pieces], response_ids.device)
    else:
        extra = {}
    hidden = decoder(input_ids=torch.cat(pieces)[None], position_ids=torch.cat(positions).to(device)[None],
                     attention_mask=None, use_cache=False, **extra).last_hidden_state[0]
    if not targets:
        empty = torch.zeros(0, dtype=torch.long, device=device)
        return hidden[:0], empty, empty
    return (hidden.index_select(0, torch.cat(targets).to(device)), torch.cat(rows).to(device),
            torch.cat(cols).to(device))


def varlen_kwargs(pieces: list[int], device: torch.device) -> dict:
    """flash-attention's varlen arguments for a packed pass whose rows are prompt, response, prompt, response, ...
    (`pieces`: their token counts in order): each row's start offsets (cu_seq_lens, int32, one past the end last) and
    the longest row, as transformers' flash path takes them (FlashAttentionKwargs)."""
    rows = [prompt + response for prompt, response in zip(pieces[0::2], pieces[1::2])] or [sum(pieces)]
    starts = torch.tensor([0, *itertools.accumulate(rows)], dtype=torch.int32, device=device)
    longest = max(rows)
    return {"cu_seq_lens_q": starts, "cu_seq_lens_k": starts, "max_length_q": longest, "max_length_k": longest}


def response_token_hidden_states(model, prompt_ids, prompt_mask, response_ids, response_mask,
                                 prompt_index: torch.Tensor, options: PassOptions = PassOptions(),
                                 tokens: PassTokens | None = None):
    """(hidden [N, H], rows [N], cols [N]): the hidden state predicting each real response token (row, col).

    Prompts [p, P] are left-padded, responses [B, T] right-padded; `prompt_index` [B] names each row's prompt (a
    group's rows share one: a whole group's, a slice of it, or the rows of it a token-budget micro-batch holds).
    Each prompt runs once and its KV cache serves its rows; gradients flow back through the shared prompt. Responses
    run in buckets of similar length (length_buckets), so short answers are not padded to the longest one of the
    batch. `options.packed`: one padding-free pass instead; `options.lockstep`: as many bucket calls as the process
    group's rank with the most (module docstring). `tokens` counts the positions fed (an idle call's token is not one).
    """
    tokens = PassTokens() if tokens is None else tokens
    prompt_index = prompt_index.to(response_ids.device)
    if options.packed:
        return _packed_hidden(model.get_decoder(), prompt_ids, prompt_mask, response_ids, response_mask, prompt_index,
                              tokens)
    if activation_checkpointing(model) and torch.is_grad_enabled():
        hidden = _repeated_prompt_hidden(model, prompt_ids, prompt_mask, response_ids, response_mask, prompt_index,
                                         tokens)
        rows, cols = response_mask.bool().nonzero(as_tuple=True)
        return hidden[rows, cols], rows, cols
    decoder = model.get_decoder()
    cache = DynamicCache()
    tokens.add(prompt_mask.numel(), prompt_mask.sum())
    prompt_last = decoder(input_ids=prompt_ids, attention_mask=prompt_mask,
                          position_ids=position_ids_from_mask(prompt_mask), **kv_cache(decoder, cache),
                          use_cache=True).last_hidden_state[:, -1]
    prompt = PromptPass(prompt_last, [(keys, values) for keys, values, *_ in cache], prompt_mask, prompt_index)
    # embedded once for all buckets: each embedding lookup's backward writes a vocabulary-sized gradient
    response_embeds = model.get_input_embeddings()(response_ids)
    return _bucketed_hidden(decoder, prompt, response_embeds, response_mask, options.lockstep, tokens)


@dataclass(frozen=True)
class PromptPass:
    """What the bucketed pass keeps of its prompts' decoder call: each prompt's last hidden state [p, H] (it predicts
    response token 0), its KV cache (per layer keys and values [p, kv heads, P, d]) and mask [p, P], and each row's
    prompt (`index` [B])."""

    last: torch.Tensor
    kv: list[tuple[torch.Tensor, torch.Tensor]]
    mask: torch.Tensor
    index: torch.Tensor


def _bucketed_hidden(decoder, prompt: PromptPass, response_embeds, response_mask, lockstep: bool,
                     tokens: PassTokens):
    """(hidden [N, H], rows [N], cols [N]) of the responses run in buckets of similar length after their prompts;
    `lockstep`: as many bucket calls as the process group's rank with the most."""
    real = response_mask.bool()
    # a row's length is its last real position + 1
    lengths = (real * torch.arange(1, real.shape[1] + 1, device=real.device)).amax(1).tolist()
    buckets = length_buckets(lengths)
    hidden_parts, row_parts, col_parts = [], [], []
    for index in range(agreed_count(len(buckets), lockstep, real.device)):
        # past this rank's buckets (lockstep): a bucket of its first row that keeps nothing
        bucket = buckets[index] if index < len(buckets) else [0]
        length = max(lengths[row] for row in bucket) if index < len(buckets) else 0
        rows = torch.tensor(bucket, device=real.device)
        prompts = prompt.index[rows]
        if length == 1 and not lockstep:  # predicted by the prompts' last positions: no decoder call
            hidden = per_row(prompt.last, prompts)[:, None]
        else:
            # in lockstep every bucket runs the same operations on every rank, one-token answers and the buckets past
            # this rank's included (on at least one token, kept or not), so that the backward meets the modules in the
            # same order on every rank
            hidden = _bucket_hidden(decoder, per_row(prompt.last, prompts),
                                    [(per_row(k, prompts), per_row(v, prompts)) for k, v in prompt.kv],
                                    prompt.mask[prompts], response_embeds, response_mask, rows, max(length, 2))
            if length > 1:  # the positions fed for this rank's answers (not the lockstep ones)
                fed = response_mask[rows, : length - 1]
                tokens.add(fed.numel(), fed.sum())
        keep = real[rows, : hidden.shape[1]] & (index < len(buckets))
        bucket_rows, cols = keep.nonzero(as_tuple=True)
        hidden_parts.append(hidden[bucket_rows, cols])
        row_parts.append(rows[bucket_rows])
        col_parts.append(cols)
    if not hidden_parts:
        empty = response_mask.new_zeros(0, dtype=torch.long)
        return prompt.last.new_zeros(0, prompt.last.shape[-1]), empty, empty
    return torch.cat(hidden_parts), torch.cat(row_parts), torch.cat(col_parts)


def response_logprobs(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, response_ids: torch.Tensor,
                      response_mask: torch.Tensor, *, prompt_index: torch.Tensor | None = None,
                      options: PassOptions = PassOptions(),
                      tokens: PassTokens | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs [B, T] (differentiable when grad is enabled) and entropy [B, T] (None without
    `options.with_entropy`) of responses.

    `response_mask` [B, T] marks real response tokens; other positions get 0. `prompt_index` [B]: each row's prompt
    (None: one prompt per row); `tokens`: as response_token_hidden_states; `options`: PassOptions. A tuple, not a
    dataclass: DeepSpeed finds the tensors of a module's output in tuples (its backward hooks go on them).
    """
    if prompt_index is None:
        prompt_index = torch.arange(response_ids.shape[0])
    flat_hidden, rows, cols = response_token_hidden_states(model, prompt_ids, prompt_mask, response_ids,
                                                           response_mask, prompt_index, options, tokens)
    flat_targets = response_ids[rows, cols]
    head = model.get_output_embeddings()
    chunk_head = chunk_head_function(options.with_entropy, options.entropy_grad, options.recompute_head,
                                     torch.is_grad_enabled())
    chunks = [chunk_head(head, flat_hidden[part], flat_targets[part], options.temperature)
              for part in head_chunks(flat_hidden.shape[0], options.chunk_tokens, options.lockstep,
                                      flat_hidden.device)]
    logp = _scatter([c.logp for c in chunks], rows, cols, response_mask.shape, flat_hidden.device)
    if not options.with_entropy:
        return logp, None
    return logp, _scatter([c.entropy for c in chunks], rows, cols, response_mask.shape, flat_hidden.device)


def with_response_pass(model: torch.nn.Module) -> torch.nn.Module:
    """`model` (a causal LM, or a PEFT model around one) given the response pass as its forward, once (again is a
    no-op): called with `response_pass` (PassOptions), `model(prompt_ids, prompt_mask, response_ids, response_mask,
    prompt_index=..., response_pass=..., tokens=...)` returns response_logprobs' (log-probs, entropy); any other call
    runs the model class's own forward (generation, a loss over labels).

    The trainer's passes call the decoder and chunks of the output layer themselves (vocabulary-sized logits never
    exist for all tokens at once), not the class's forward; as the model's forward they are module calls, so that what
    wraps the model runs around them as around any forward. DeepSpeed keeps per-micro-batch state in
    `DeepSpeedEngine.forward`, which calls `self.module(...)`, and in the hooks it puts on the module and on the
    outputs: ZeRO's backward bookkeeping, under ZeRO-3 the micro-step counter without which a micro-batch's gradients
    overwrite the previous ones instead of adding up, and the top-level module's pre-forward hook that starts ZeRO-3's
    trace of the module order anew (a pass that skipped it would run on from the previous pass's position in the
    trace, invalidate it, and leave DeepSpeed prefetching nothing: the no-grad passes too, which call the module
    without the engine). The instance's `forward` shadows the class's (nn.Module.__call__ reads `self.forward`); a
    bound method, so that a deep copy (the KL reference) runs its own pass."""
    installed = vars(model).get("forward")
    if installed is not None:
        if getattr(installed, "__func__", None) is not _forward_or_response_pass:
            raise ValueError(f"{type(model).__name__} already has an instance forward ({installed!r})")
        return model
    model.forward = types.MethodType(_forward_or_response_pass, model)
    return model


def _forward_or_response_pass(model: torch.nn.Module, *args, response_pass: PassOptions | None = None, **kwargs):
    if response_pass is None:
        return type(model).forward(model, *args, **kwargs)
    return response_logprobs(model, *args, options=response_pass, **kwargs)

"""Micro-benchmarks behind docs/performance.md: matmul peak, log-prob pass, sampling, AdamW kinds, and the roofline
(matmul at SmolLM2-135M's shapes, memory bandwidth, generation's achieved weight bandwidth).

    python -m tokenpo.bench.micro --prompts 8 --group-size 4 --max-new-tokens 32 --threads 2

The plain log-prob pass is what TRL does: every (prompt + completion) row through the whole model, the
full-vocabulary logits of every position, log-softmax, gather. Both passes score the same completions,
sampled by tokenpo's rollout engine from the step's prompts (so their lengths are the real ones).
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from tokenpo.bench.settings import BenchSettings, step_examples, train_config


def best_of(fn, repeats: int) -> float:
    """Fastest of `repeats` timed calls after one warm-up call (seconds)."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def matmul_gflops(threads: int, n: int = 2048, repeats: int = 3) -> float:
    """fp32 torch.mm throughput on n x n matrices with `threads` threads: the machine's practical peak."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        a, b = torch.randn(n, n), torch.randn(n, n)
        return 2 * n**3 / best_of(lambda: torch.mm(a, b), repeats) / 1e9
    finally:
        torch.set_num_threads(before)


def plain_response_logprobs(model, prompt_ids, prompt_mask, response_ids, response_mask, group_size: int):
    """Log-probs [B, T] the straightforward way: prompts repeated G times, logits of every position."""
    ids = torch.cat([prompt_ids.repeat_interleave(group_size, 0), response_ids], 1)
    mask = torch.cat([prompt_mask.repeat_interleave(group_size, 0), response_mask.long()], 1)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits
    resp_len = response_ids.shape[1]
    logp = torch.log_softmax(logits[:, -resp_len - 1 : -1].float(), -1)
    return logp.gather(-1, response_ids[..., None]).squeeze(-1) * response_mask


def step_rollout(settings: BenchSettings):
    """(model, tokenizer, cfg, prompt ids, responses) of step 1's prompts, sampled like the trainer does."""
    from tokenpo.data.prompts import prompt_token_ids
    from tokenpo.evaluation.benchmark import stop_token_ids
    from tokenpo.models.loading import load_model
    from tokenpo.rollout.engine import SamplingParams
    from tokenpo.rollout.hf import generate_hf

    cfg, _ = train_config(settings)
    tokenizer, model = load_model(cfg.model, cfg.seed)
    prompts = [prompt_token_ids(e.problem, tokenizer, cfg.data.template) for e in step_examples(cfg, 1)[0]]
    r = cfg.rollout
    params = SamplingParams(r.group_size, r.max_new_tokens, r.temperature, r.top_p,
                            stop_token_ids(tokenizer, r.eos_tokens), r.share_prefill)
    out = generate_hf(model, prompts, params, tokenizer.pad_token_id, torch.Generator().manual_seed(settings.seed))
    return model, tokenizer, cfg, prompts, out.token_ids


def logprob_timings(settings: BenchSettings, repeats: int = 2) -> dict:
    """Seconds of tokenpo's response_logprobs vs the plain pass on one micro-batch of real rollouts:
    no-grad (the reference pass) and forward + backward (the update)."""
    from tokenpo.models.logprobs import PassOptions, response_logprobs
    from tokenpo.trainer import pad_groups

    model, tokenizer, cfg, prompts, responses = step_rollout(settings)
    groups = settings.sequences_per_pass // settings.group_size
    t = pad_groups(prompts[:groups], responses[: groups * settings.group_size], tokenizer.pad_token_id,
                   torch.device("cpu"))
    args = (model, t.prompt_ids, t.prompt_mask, t.response_ids, t.response_mask)

    def tokenpo_pass():
        return response_logprobs(*args, prompt_index=t.prompt_index, options=PassOptions(with_entropy=False))[0]

    def plain_pass():
        return plain_response_logprobs(*args, group_size=settings.group_size)

    def no_grad(fn):
        def run():
            with torch.no_grad():
                fn()
        return run

    def with_backward(fn):
        def run():
            fn().sum().backward()
            model.zero_grad(set_to_none=True)
        return run

    out = {"prompt_tokens": int(t.prompt_mask.sum()), "completion_tokens": int(t.response_mask.sum()),
           "padded_completion_tokens": t.response_mask.numel()}
    for name, fn in (("tokenpo", tokenpo_pass), ("plain", plain_pass)):
        out[f"{name}_no_grad_s"] = best_of(no_grad(fn), repeats)
        out[f"{name}_forward_backward_s"] = best_of(with_backward(fn), repeats)
    with torch.no_grad():
        out["max_abs_diff"] = float((tokenpo_pass() - plain_pass()).abs().max())
    return out


def sampling_timings(settings: BenchSettings, vocab: int = 49152, repeats: int = 5) -> dict:
    """Seconds to sample one token for prompts x G rows: tokenpo's inverse CDF vs torch.multinomial."""
    from tokenpo.rollout.engine import SamplingParams
    from tokenpo.rollout.hf import sample_next

    logits = torch.randn(settings.prompts * settings.group_size, vocab)
    generator = torch.Generator().manual_seed(0)
    params = SamplingParams(settings.group_size, 1)
    return {
        "inverse_cdf_s": best_of(lambda: sample_next(logits, params, generator), repeats),
        "multinomial_s": best_of(lambda: torch.multinomial(torch.softmax(logits, -1), 1, generator=generator),
                                 repeats),
    }


def model_shape_gflops(hidden: int, intermediate: int, vocab: int, tokens: int = 1024, repeats: int = 3) -> dict:
    """fp32 torch.mm GFLOP/s at the decoder's matmul shapes for `tokens` rows (at the current thread count): the
    attention projections [t, h] x [h, h], the MLP's [t, h] x [h, i] and [t, i] x [i, h], the output layer
    [t, h] x [h, V], and their FLOP-weighted mean (a decoder layer's mix, the head once per layer-stack)."""
    shapes = {"attention_projection": (hidden, hidden), "mlp_up": (hidden, intermediate),
              "mlp_down": (intermediate, hidden), "output_layer": (hidden, vocab)}
    out, flops, seconds = {}, 0.0, 0.0
    for name, (k, n) in shapes.items():
        a, b = torch.randn(tokens, k), torch.randn(k, n)
        spent = best_of(lambda: torch.mm(a, b), repeats)
        out[name] = 2 * tokens * k * n / spent / 1e9
        flops, seconds = flops + 2 * tokens * k * n, seconds + spent
    out["weighted"] = flops / seconds / 1e9
    return out


def memory_bandwidth_gbs(gib: float = 1.0, repeats: int = 3) -> dict:
    """GB/s of streaming `gib` GiB of fp32 at the current thread count: read (a sum, as a decode step reads the
    weights) and copy (read + write)."""
    x = torch.ones(int(gib * 2**30 / 4))
    y = torch.empty_like(x)
    read = x.numel() * 4 / best_of(lambda: x.sum(), repeats) / 1e9
    copy = 2 * x.numel() * 4 / best_of(lambda: y.copy_(x), repeats) / 1e9
    return {"read": read, "copy": copy}


def generation_bandwidth(settings: BenchSettings, repeats: int = 2) -> dict:
    """The hf engine's decode steps against the memory bandwidth: `prompts` x G rows, `max_new_tokens` each (no stop
    token), the prefill timed apart; each decode step reads every weight once (fp32), so weight bytes x steps /
    decode seconds is the achieved weight bandwidth."""
    from tokenpo.data.prompts import prompt_token_ids
    from tokenpo.models.loading import load_model
    from tokenpo.models.logprobs import left_pad
    from tokenpo.rollout.engine import SamplingParams
    from tokenpo.rollout.hf import generate_hf

    cfg, _ = train_config(settings)
    tokenizer, model = load_model(cfg.model, cfg.seed)
    prompts = [prompt_token_ids(e.problem, tokenizer, cfg.data.template) for e in step_examples(cfg, 1)[0]]
    params = SamplingParams(settings.group_size, settings.max_new_tokens, 1.0, 1.0, (), True)
    ids, mask = left_pad(prompts, tokenizer.pad_token_id)

    def prefill():
        with torch.no_grad():
            model(input_ids=ids, attention_mask=mask, logits_to_keep=1)

    total = best_of(lambda: generate_hf(model, prompts, params, tokenizer.pad_token_id,
                                        torch.Generator().manual_seed(0)), repeats)
    decode = total - best_of(prefill, repeats)
    steps = settings.max_new_tokens - 1
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    config = model.config
    return {"shape": {"hidden": config.hidden_size, "intermediate": config.intermediate_size,
                      "vocab": config.vocab_size},
            "rows": len(prompts) * settings.group_size, "decode_steps": steps, "generate_s": total,
            "decode_s": decode, "weight_bytes": weight_bytes, "weight_gb_per_s": weight_bytes * steps / decode / 1e9,
            "tokens_per_s": len(prompts) * settings.group_size * settings.max_new_tokens / total}


def adamw_timings(settings: BenchSettings, repeats: int = 3) -> dict:
    """Seconds of one AdamW step over the model's parameters: torch's default, foreach, fused."""
    from tokenpo.models.loading import load_model

    cfg, _ = train_config(settings)
    _, model = load_model(cfg.model, cfg.seed)
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        p.grad = torch.randn_like(p) * 1e-3
    out = {}
    for name, kwargs in (("default", {}), ("foreach", {"foreach": True}), ("fused", {"fused": True})):
        optimizer = torch.optim.AdamW(params, lr=settings.lr, **kwargs)
        out[f"{name}_s"] = best_of(optimizer.step, repeats)
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m tokenpo.bench.micro", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2_135m")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--only", choices=("matmul", "logprobs", "sampling", "adamw", "roofline"), action="append",
                   help="run only these parts (repeatable; default: all)")
    args = p.parse_args(argv)
    settings = BenchSettings(model=args.model, prompts=args.prompts, group_size=args.group_size,
                             max_new_tokens=args.max_new_tokens, threads=args.threads)
    settings.validate()
    torch.set_num_threads(args.threads)
    parts = args.only or ["matmul", "logprobs", "sampling", "adamw", "roofline"]
    out = {"settings": settings.to_dict()}
    if "matmul" in parts:
        out["matmul_gflops_per_s"] = {f"{n}_threads": matmul_gflops(n) for n in range(1, args.threads + 1)}
    if "logprobs" in parts:
        out["logprobs"] = logprob_timings(settings)
    if "sampling" in parts:
        out["sampling"] = sampling_timings(settings)
    if "adamw" in parts:
        out["adamw"] = adamw_timings(settings)
    if "roofline" in parts:  # the machine's limits at the model's shapes, and generation against its bandwidth
        out["generation"] = generation_bandwidth(settings)
        shape = out["generation"]["shape"]
        out["matmul_at_model_shapes_gflops_per_s"] = model_shape_gflops(shape["hidden"], shape["intermediate"],
                                                                        shape["vocab"])
        out["memory_bandwidth_gb_per_s"] = memory_bandwidth_gbs()
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()

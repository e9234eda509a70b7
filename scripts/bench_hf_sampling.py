"""The `hf` engine's decode loop and sampler before and after the two-level inverse CDF and the stop check on the
device (rollout.hf_stop_check_every), in one process, interleaved.

    OMP_NUM_THREADS=1 .venv/bin/python scripts/bench_hf_sampling.py [--repeats 5] [--threads 1]

1. generate_hf on SmolLM2-135M (the embedded model) for step 1's 8 prompts x 4 samples x 64 new tokens (temperature
   1), with the tokenizer's EOS as stop token and with none (then every way samples the same tokens): the previous
   loop (a host check every token, a float64 cumulative sum over the vocabulary: tokenpo/bench/previous_hf.py), the
   new one with the CPU's default check interval (1), and with 16 (a GPU's default). Generated tokens
   per second of wall clock and per CPU second of the process (less sensitive to other jobs on a shared machine):
   median, min, max over the repeats.
2. The sampler alone on [32, 49152] and [32, 151936] random logits (SmolLM2's and Qwen2.5's vocabularies): ms per
   sample_next call, previous vs new, and whether they picked the same tokens from the same generator.

Old and new alternate within each repeat; the machine's load average is printed before and after (a shared machine
slows both alike, which the interleaving spreads over both).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from tokenpo.bench.previous_hf import previous_generate_hf, previous_sample_next
from tokenpo.rollout.engine import SamplingParams
from tokenpo.rollout.hf import generate_hf, sample_next


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def summary(values: list[float]) -> str:
    return f"median {statistics.median(values):8.2f} (min {min(values):.2f}, max {max(values):.2f}, n {len(values)})"


def generation(repeats: int, prompts: int, group_size: int, new_tokens: int) -> None:
    from tokenpo.bench.settings import BenchSettings, step_examples, train_config
    from tokenpo.data.prompts import prompt_token_ids
    from tokenpo.evaluation.benchmark import stop_token_ids
    from tokenpo.models.loading import load_model

    cfg, _ = train_config(BenchSettings(prompts=prompts, group_size=group_size, max_new_tokens=new_tokens))
    tokenizer, model = load_model(cfg.model, cfg.seed)
    prompt_ids = [prompt_token_ids(e.problem, tokenizer, cfg.data.template) for e in step_examples(cfg, 1)[0]]
    pad = tokenizer.pad_token_id
    for stop in (stop_token_ids(tokenizer, cfg.rollout.eos_tokens), ()):
        params = SamplingParams(group_size, new_tokens, 1.0, 1.0, stop)
        ways = {
            "previous (check every token, float64 cumsum)":
                lambda g: previous_generate_hf(model, prompt_ids, params, pad, g),
            "new, check every 1 (CPU default)": lambda g: generate_hf(model, prompt_ids, params, pad, g, 1),
            "new, check every 16 (GPU default)": lambda g: generate_hf(model, prompt_ids, params, pad, g, 16),
        }
        print(f"generate_hf: {cfg.model.name}, {len(prompt_ids)} prompts x {group_size} x {new_tokens} new tokens, "
              f"{torch.get_num_threads()} thread(s), temperature 1, "
              + (f"stop tokens {list(stop)}" if stop else "no stop token (every way samples the same tokens)"))
        for fn in ways.values():  # warm-up
            fn(torch.Generator().manual_seed(0))
        wall: dict[str, list[float]] = {name: [] for name in ways}
        cpu: dict[str, list[float]] = {name: [] for name in ways}
        counts: dict[str, list[int]] = {name: [] for name in ways}
        for repeat in range(repeats):
            for name, fn in ways.items():
                start, start_cpu = time.perf_counter(), time.process_time()
                out = fn(torch.Generator().manual_seed(repeat))
                seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - start_cpu
                tokens = sum(map(len, out.token_ids))
                wall[name].append(tokens / seconds)
                cpu[name].append(tokens / cpu_seconds)
                counts[name].append(tokens)
        for name in ways:
            print(f"  {name:46s} tokens/s {summary(wall[name])}; per CPU second {summary(cpu[name])}; "
                  f"tokens {statistics.median(counts[name]):.0f}")


def sampler(repeats: int, rows: int, calls: int) -> None:
    params = SamplingParams(1, 1, 1.0, 1.0)
    for vocab in (49152, 151936):
        logits = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(0)) * 3
        ways = {"previous": previous_sample_next, "new": sample_next}
        same = torch.equal(*(fn(logits, params, torch.Generator().manual_seed(1)) for fn in ways.values()))
        times: dict[str, list[float]] = {name: [] for name in ways}
        for _ in range(repeats):
            for name, fn in ways.items():
                generator = torch.Generator().manual_seed(2)
                start = time.perf_counter()
                for _ in range(calls):
                    fn(logits, params, generator)
                times[name].append((time.perf_counter() - start) / calls * 1e3)
        print(f"sample_next on [{rows}, {vocab}] logits, temperature 1 (same picks: {same}):")
        for name, values in times.items():
            print(f"  {name:10s} ms/call {summary(values)}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--sampler-calls", type=int, default=20, help="sample_next calls per timed repeat")
    p.add_argument("--only", choices=("generation", "sampler"))
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    print(f"load average before: {load_average()}")
    if args.only != "generation":
        sampler(args.repeats, 32, args.sampler_calls)
    if args.only != "sampler":
        generation(args.repeats, args.prompts, args.group_size, args.max_new_tokens)
    print(f"load average after: {load_average()}")


if __name__ == "__main__":
    main()

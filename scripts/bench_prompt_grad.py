"""Cost and order-dependence of the two ways to give each response its prompt's KV cache (issue 28, determinism).

    .venv/bin/python scripts/bench_prompt_grad.py [--prompts 4] [--group 8] [--length 60] [--repeats 50]

For one layer's keys [prompts, 4 heads, length, 16] gathered to prompts x group rows in shuffled row order (a
length bucket's rows), times forward + backward of the gather: indexing (`k[groups]`, whose CPU backward is
index_put_ accumulate: parallel atomic adds with 2+ threads above 32768 elements) and index_select (what
tokenpo.models.logprobs.per_row does: index_add_, in row order). Prints per way: median ms (min-max, n) and in how
many of the n backward passes the gradient differs bitwise from the first one.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from tokenpo.models.logprobs import per_row


def timed_grads(gather: Callable, keys: torch.Tensor, groups: torch.Tensor, upstream: torch.Tensor,
                repeats: int) -> tuple[list[float], int]:
    """(ms per forward + backward, how many gradients differ bitwise from the first)."""
    times, first, differing = [], None, 0
    for _ in range(repeats):
        keys.grad = None
        start = time.perf_counter()
        (gather(keys, groups) * upstream).sum().backward()
        times.append((time.perf_counter() - start) * 1e3)
        first = keys.grad.clone() if first is None else first
        differing += not torch.equal(keys.grad, first)
    return times, differing


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--length", type=int, default=60)
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args()
    generator = torch.Generator().manual_seed(0)
    keys = torch.randn(args.prompts, 4, args.length, 16, generator=generator, requires_grad=True)
    rows = torch.randperm(args.prompts * args.group, generator=generator)
    groups = rows // args.group
    upstream = torch.randn(len(rows), 4, args.length, 16, generator=generator)
    print(f"keys {tuple(keys.shape)} -> {len(rows)} rows, {torch.get_num_threads()} threads")
    for name, gather in (("indexing k[groups]", lambda k, g: k[g]), ("index_select (per_row)", per_row)):
        times, differing = timed_grads(gather, keys, groups, upstream, args.repeats)
        print(f"{name}: {statistics.median(times):.2f} ms ({min(times):.2f}-{max(times):.2f}, n={len(times)}), "
              f"gradient differs from the first in {differing}/{len(times)}")


if __name__ == "__main__":
    main()

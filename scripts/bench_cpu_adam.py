"""The optimizer step under deepspeed.offload_optimizer (the fp32 master weights and Adam's states in host memory):
torch's fused AdamW (what tokenpo passes DeepSpeed) against DeepSpeed's CPUAdam (its C++ SIMD kernel, JIT-built at
first use, about a minute), on the same fp32 parameters and gradients, on this machine's cores.

    .venv/bin/python scripts/bench_cpu_adam.py [--params 50e6] [--repeats 5] [--threads N]

Prints the median seconds of one step of each and how far their updates are apart (they implement the same AdamW).
docs/performance.md quotes it.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def steps(optimizer, params: list[torch.Tensor], repeats: int) -> list[float]:
    times = []
    for _ in range(repeats + 1):  # the first step allocates the states
        start = time.perf_counter()
        optimizer.step()
        times.append(time.perf_counter() - start)
    return times[1:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=float, default=50e6, help="fp32 parameters (default %(default)g)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    from deepspeed.ops.adam import DeepSpeedCPUAdam

    count = int(args.params)
    # layer-sized tensors, as a model's parameter list is
    shapes = [(4096, 4096)] * (count // (4096 * 4096)) + [(count % (4096 * 4096),)]
    generator = torch.Generator().manual_seed(0)
    weights = [torch.randn(shape, generator=generator) for shape in shapes]
    grads = [torch.randn(shape, generator=generator) * 1e-3 for shape in shapes]
    results, updates = {}, {}
    for name, build in (("torch AdamW (fused)", lambda p: torch.optim.AdamW(p, lr=1e-5, weight_decay=0.0, fused=True)),
                        ("DeepSpeed CPUAdam", lambda p: DeepSpeedCPUAdam(p, lr=1e-5, weight_decay=0.0,
                                                                         adamw_mode=True))):
        params = [torch.nn.Parameter(w.clone()) for w in weights]
        for param, grad in zip(params, grads):
            param.grad = grad.clone()
        optimizer = build(params)
        results[name] = statistics.median(steps(optimizer, params, args.repeats))
        updates[name] = [p.detach() - w for p, w in zip(params, weights)]
    names = list(results)
    apart = max(float((a - b).abs().max()) for a, b in zip(updates[names[0]], updates[names[1]]))
    scale = max(float(u.abs().max()) for u in updates[names[0]])
    print(f"{count / 1e6:.0f}M fp32 parameters, {torch.get_num_threads()} threads, median of {args.repeats} steps:")
    for name, seconds in results.items():
        print(f"  {name:<20} {seconds:.3f} s/step")
    print(f"  largest difference between the two updates: {apart:.2e} (largest update {scale:.2e})")


if __name__ == "__main__":
    main()

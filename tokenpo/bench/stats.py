"""Per-step timings -> medians, throughput, achieved FLOP/s and peak memory of one framework."""

from __future__ import annotations

import resource
import statistics
import threading

import psutil

# Seconds per step spent in each phase. `update` is everything after the reference pass: policy forward,
# loss, backward and optimizer step; the last three are split out as `policy_forward` (forward + loss),
# `backward` and `optimizer` (gradient clipping + AdamW step). `weight_sync`: the rollout engine's copy of the
# updated weights (0 for the hf engine, which generates with the policy itself, and for TRL without vLLM).
PHASES = ("generate", "reward", "reference", "old_logprob", "update", "policy_forward", "backward", "optimizer",
          "weight_sync")
# with generation ahead of the update (rollout.async.max_staleness > 0): the generator process's seconds per batch,
# its wait for the weights it must sample with, and the trainer's waits for rollouts and for the weights' copy
AHEAD_PHASES = ("generator", "generator_wait_weights", "trainer_wait_rollouts", "trainer_wait_weights")


def model_shape(model) -> dict:
    """What the FLOP estimate needs: parameters outside the input embedding (LoRA adapters included: their matmuls
    run too), hidden width, vocabulary; and the parameters that train (all, or the adapters)."""
    embedding = model.get_input_embeddings().weight
    total = sum(p.numel() for p in model.parameters())
    head = model.get_output_embeddings().weight
    # a tied head is the embedding; its matmul is counted separately (only on completion positions)
    untied_head = 0 if head.data_ptr() == embedding.data_ptr() else head.numel()
    return {"non_embedding_params": total - embedding.numel() - untied_head,
            "hidden_size": int(embedding.shape[1]), "vocab_size": int(embedding.shape[0]),
            "trainable_params": sum(p.numel() for p in model.parameters() if p.requires_grad)}


def forward_flops(prompt_tokens: int, completion_tokens: int, shape: dict) -> float:
    """2 x params x tokens through the decoder (each prompt once) + the output layer on completion tokens only.

    Attention scores (O(length^2), a few percent at these lengths) are left out.
    """
    decoder = 2.0 * shape["non_embedding_params"] * (prompt_tokens + completion_tokens)
    head = 2.0 * shape["hidden_size"] * shape["vocab_size"] * completion_tokens
    return decoder + head


class PeakMemory:
    """Peak resident memory of this process tree while inside `with`, in MB.

    `process`: this process's own peak (getrusage, exact). `tree`: the largest sum of RSS over this process and
    all its children (tokenpo's reward workers), sampled every `interval_s`; pages shared between processes
    count once per process, so it errs high. `total` = the larger of the two.
    """

    def __init__(self, interval_s: float = 0.1):
        self.interval_s = interval_s
        self.tree_bytes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        me = psutil.Process()
        while not self._stop.is_set():
            total = 0
            for proc in [me, *me.children(recursive=True)]:
                try:
                    total += proc.memory_info().rss
                except psutil.Error:  # a child that just exited
                    pass
            self.tree_bytes = max(self.tree_bytes, total)
            self._stop.wait(self.interval_s)

    def __enter__(self) -> "PeakMemory":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def report(self) -> dict:
        own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB
        tree = self.tree_bytes / 2**20
        return {"process": round(own, 1), "tree": round(tree, 1), "total": round(max(own, tree), 1)}


def summarise(runs: list[dict], shape: dict, warmup_steps: int = 1) -> dict:
    """Medians over every run's steps after its first `warmup_steps`, plus throughput and FLOP/s.

    `runs`: [{"steps": [{"step_s", <phase>..., "completion_tokens", "prompt_tokens"}], "peak_rss_mb": {...}}].
    FLOP/s are the useful work (the same for both frameworks: each prompt once, head on completions only)
    over the phase's summed seconds: forward + backward = 3 x forward.
    """
    measured = [step for run in runs for step in run["steps"][warmup_steps:]]
    if not measured:
        raise ValueError(f"no measured steps: every run has at most {warmup_steps} warm-up step(s)")
    step_s = [s["step_s"] for s in measured]
    tokens = sum(s["completion_tokens"] for s in measured)
    fwd = sum(forward_flops(s["prompt_tokens"], s["completion_tokens"], shape) for s in measured)
    update_s = sum(s["update"] for s in measured)
    ahead = [p for p in AHEAD_PHASES if all(p in s for s in measured)]
    # the engine's own seconds: the generator process's when it runs ahead (the trainer's "generate" is then a wait)
    generate_s = sum(s["generator"] if "generator" in ahead else s["generate"] for s in measured)
    reference_s = sum(s["reference"] for s in measured)
    return {
        "median_step_s": statistics.median(step_s),
        "step_s": step_s,
        # CPU seconds of the framework's process (all its threads) per step
        "median_step_cpu_s": statistics.median(s["step_cpu_s"] for s in measured),
        "phases_s": {p: statistics.median(s[p] for s in measured) for p in PHASES},
        # empty when generation runs in turn
        "ahead_s": {p: statistics.median(s[p] for s in measured) for p in ahead},
        "completion_tokens_per_s": tokens / sum(step_s),
        "completion_tokens_per_step": tokens / len(measured),
        # the rollout engine's speed: completion tokens over the generation phase alone
        "generation_tokens_per_s": tokens / generate_s if generate_s > 0 else None,
        "weight_sync_frac": sum(s["weight_sync"] for s in measured) / sum(step_s),
        "update_gflops_per_s": 3 * fwd / update_s / 1e9 if update_s > 0 else None,
        "reference_gflops_per_s": fwd / reference_s / 1e9 if reference_s > 0 else None,
        "peak_rss_mb": max(run["peak_rss_mb"]["total"] for run in runs),
        # the training process alone (its ru_maxrss), without reward workers or other children
        "peak_rss_process_mb": max(run["peak_rss_mb"]["process"] for run in runs),
        "measured_steps": len(measured),
    }

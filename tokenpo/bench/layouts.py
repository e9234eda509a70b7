"""The update phase on a length-skewed batch under each way of splitting it into passes: whole groups
(trainer.micro_batch_size), a token budget (trainer.micro_batch_tokens) and the budget packed without padding
(trainer.pack_sequences), with gradient checkpointing off and on.

    python -m tokenpo.bench.layouts --out docs/data/bench/layouts.json

One batch for every layout: the first `--prompts` GSM8K training questions (../shared/data/gsm8k_train.jsonl) under
the model's template, `--group-size` responses each sampled by the `hf` engine to `--max-new-tokens` (no stop token),
then cut to drawn lengths: one response in eight keeps all of them, the others keep 16-64 tokens, so the longest is
>= 8x the median at 512 (the lengths of a DAPO batch: a 20k cap, most answers far shorter). Each layout runs in its
own process (its peak memory is its own): one warm-up update on the rows cut to 4 tokens, then `update_policy` timed (the reference pass and the
update: GRPO, beta 0.04, one mini-batch), its peak RSS over the timed update read from /proc (VmHWM after resetting
it). Layouts alternate over `--repeats` rounds so a load change hits all of them; medians are reported.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

GSM8K = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "gsm8k_train.jsonl"
# layout name -> trainer overrides
LAYOUTS = {
    "whole_group": [],
    "token_budget": ["trainer.micro_batch_tokens={budget}"],
    "packed": ["trainer.micro_batch_tokens={budget}", "trainer.pack_sequences=true"],
}
LONG_EVERY = 8  # one response in eight keeps every sampled token
SHORT = (16, 64)  # the others keep this many tokens (uniform)


def overrides(args, layout: str, checkpointing: bool) -> list[str]:
    return ["model=smollm2_135m", "algorithm=grpo", "logger.mode=disabled", f"rollout.group_size={args.group_size}",
            f"data.prompts_per_step={args.prompts}", f"rollout.max_new_tokens={args.max_new_tokens}",
            f"trainer.micro_batch_size={args.micro_batch_size}", f"trainer.threads={args.threads}",
            f"model.gradient_checkpointing={str(checkpointing).lower()}",
            *(o.format(budget=args.budget) for o in LAYOUTS[layout])]


def make_batch(args, path: Path) -> dict:
    """Sample the batch once and write it to `path`: {"prompt_ids", "response_ids"}."""
    import torch

    from tokenpo.data.prompts import prompt_token_ids
    from tokenpo.models.loading import load_model
    from tokenpo.plan.cli import compose_train_config
    from tokenpo.rollout.engine import SamplingParams
    from tokenpo.rollout.hf import generate_hf

    torch.set_num_threads(args.threads)
    cfg = compose_train_config(overrides(args, "whole_group", False))
    tokenizer, model = load_model(cfg.model, cfg.seed)
    questions = [json.loads(line)["question"] for line in args.questions.read_text().splitlines()[: args.prompts]]
    prompts = [prompt_token_ids(q, tokenizer, cfg.data.template) for q in questions]
    params = SamplingParams(args.group_size, args.max_new_tokens, 1.0, 1.0, (), True)  # no stop: every row full
    out = generate_hf(model, prompts, params, tokenizer.pad_token_id, torch.Generator().manual_seed(args.seed))
    rng = random.Random(args.seed)
    responses = [row if i % LONG_EVERY == 0 else row[: rng.randint(*SHORT)] for i, row in enumerate(out.token_ids)]
    batch = {"prompt_ids": prompts, "response_ids": responses}
    path.write_text(json.dumps(batch))
    return batch


def reset_peak_rss() -> None:
    """VmHWM back to the current RSS (Linux: clear_refs 5)."""
    Path("/proc/self/clear_refs").write_text("5")


def peak_rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def worker(args) -> dict:
    """One layout's timed update (run in its own process); its report."""
    import torch

    from tokenpo.data import Example
    from tokenpo.deepspeed import dist
    from tokenpo.plan.cli import compose_train_config
    from tokenpo.rewards import CORRECT, WRONG
    from tokenpo.trainer import Policy
    from tokenpo.trainer import RolloutBatch
    from tokenpo.trainer import StepRollouts, rollout_batch
    from tokenpo.trainer import StepSettings, update_policy
    from tokenpo.trainer import Timings

    cfg = compose_train_config(overrides(args, args.layout, args.checkpointing))
    torch.set_num_threads(args.threads)
    dist.init_distributed("gloo")
    torch.manual_seed(0)
    tokenizer, policy = Policy.build(cfg, 1, dist.device())
    batch = json.loads(args.batch.read_text())
    rows = len(batch["response_ids"])

    run = StepSettings.from_config(cfg, tokenizer.pad_token_id)

    def rollouts(cut: int | None = None) -> RolloutBatch:  # half right in every group: every row has an advantage
        responses = [r[:cut] for r in batch["response_ids"]]
        return rollout_batch(StepRollouts(
            examples=[Example(f"q{i}", "", "") for i in range(len(batch["prompt_ids"]))],
            prompt_ids=batch["prompt_ids"], response_ids=responses, response_text=[""] * rows,
            truncated=[len(r) == args.max_new_tokens for r in responses],
            verdicts=[CORRECT if i % 2 else WRONG for i in range(rows)]), run.reward)

    update_policy(run, policy, rollouts(cut=4), Timings())  # warm-up (short rows): DeepSpeed's first-step work
    reset_peak_rss()
    timings = Timings()
    start = time.perf_counter()
    metrics = update_policy(run, policy, rollouts(), timings).metrics
    seconds = time.perf_counter() - start
    return {"layout": args.layout, "checkpointing": args.checkpointing, "update_policy_s": seconds,
            "phases_s": timings.seconds, "peak_rss_bytes": peak_rss_bytes(),
            "padding_frac": metrics["batch/padding_frac"], "micro_batches": metrics["batch/micro_batches"],
            "tokens_per_micro_batch": metrics["batch/tokens_per_micro_batch"]}


def run_worker(args, layout: str, checkpointing: bool) -> dict:
    command = [sys.executable, "-m", "tokenpo.bench.layouts", "--worker", "--batch", str(args.batch), "--layout",
               layout, *(["--checkpointing"] if checkpointing else []), *passthrough(args)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode:
        raise RuntimeError(f"{layout} (checkpointing {checkpointing}) failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def passthrough(args) -> list[str]:
    return ["--prompts", str(args.prompts), "--group-size", str(args.group_size), "--max-new-tokens",
            str(args.max_new_tokens), "--micro-batch-size", str(args.micro_batch_size), "--budget", str(args.budget),
            "--threads", str(args.threads), "--seed", str(args.seed)]


def summary(runs: list[dict]) -> list[dict]:
    """Per (checkpointing, layout): medians, and the ratio of whole-group seconds to this layout's."""
    rows = []
    for checkpointing in (False, True):
        whole = None
        for layout in LAYOUTS:
            mine = [r for r in runs if r["layout"] == layout and r["checkpointing"] == checkpointing]
            if not mine:
                continue
            seconds = statistics.median(r["update_policy_s"] for r in mine)
            whole = seconds if layout == "whole_group" else whole
            rows.append({"checkpointing": checkpointing, "layout": layout, "n": len(mine),
                         "update_policy_s_median": seconds,
                         "update_policy_s_range": [min(r["update_policy_s"] for r in mine),
                                                   max(r["update_policy_s"] for r in mine)],
                         "speedup_vs_whole_group": whole / seconds if whole else None,
                         "peak_rss_mib_median": statistics.median(r["peak_rss_bytes"] for r in mine) / 2**20,
                         "padding_frac": mine[0]["padding_frac"], "micro_batches": mine[0]["micro_batches"],
                         "tokens_per_micro_batch": mine[0]["tokens_per_micro_batch"]})
    return rows


def markdown(rows: list[dict]) -> str:
    lines = ["| checkpointing | layout | n | update s (median [min, max]) | speed-up vs whole group | peak RSS MiB | "
             "padding | passes | tokens/pass |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        low, high = r["update_policy_s_range"]
        lines.append(f"| {'on' if r['checkpointing'] else 'off'} | {r['layout']} | {r['n']} | "
                     f"{r['update_policy_s_median']:.1f} [{low:.1f}, {high:.1f}] | "
                     f"{r['speedup_vs_whole_group']:.2f}× | {r['peak_rss_mib_median']:.0f} | "
                     f"{r['padding_frac']:.1%} | {r['micro_batches']:.0f} | {r['tokens_per_micro_batch']:.0f} |")
    return "\n".join(lines)


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="python -m tokenpo.bench.layouts", description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=512)
    parser.add_argument("--micro-batch-size", type=int, default=8, help="whole-group layout: rows per pass (default "
                        "8: two groups)")
    parser.add_argument("--budget", type=int, default=2048, help="token budget of the other layouts (default 2048)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--questions", type=Path, default=GSM8K, help="GSM8K-style jsonl with a 'question' field")
    parser.add_argument("--no-checkpointing-variant", action="store_true", help="only checkpointing off")
    parser.add_argument("--out", type=Path, default=Path("outputs/bench/layouts.json"))
    parser.add_argument("--batch", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--layout", choices=list(LAYOUTS), help=argparse.SUPPRESS)
    parser.add_argument("--checkpointing", action="store_true", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args)))
        return
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.batch = args.out.with_suffix(".batch.json")
    batch = make_batch(args, args.batch) if not args.batch.exists() else json.loads(args.batch.read_text())
    lengths = sorted(map(len, batch["response_ids"]))
    print(f"batch: {len(lengths)} responses, median {statistics.median(lengths)} tokens, longest {lengths[-1]} "
          f"({lengths[-1] / statistics.median(lengths):.1f}x the median)", flush=True)
    runs = []
    for repeat in range(args.repeats):
        for checkpointing in (False,) if args.no_checkpointing_variant else (False, True):
            for layout in LAYOUTS:
                report = run_worker(args, layout, checkpointing)
                runs.append({**report, "repeat": repeat, "load_average_1m": os.getloadavg()[0]})
                print(json.dumps(runs[-1]), flush=True)
    rows = summary(runs)
    args.out.write_text(json.dumps({"settings": vars(args) | {"out": str(args.out), "batch": str(args.batch),
                                                               "questions": str(args.questions)},
                                    "response_lengths": lengths, "runs": runs, "summary": rows}, indent=1))
    print(markdown(rows))


if __name__ == "__main__":
    main()

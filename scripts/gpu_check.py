"""The GPU check (run by scripts/check_gpu.sh after its offline install): a few minutes on one CUDA device.

- bf16 training on CUDA, one process, NCCL, ZeRO 0, 2 and 3, 3 steps each (the worst case first), of the tiny model
  and of a randomly initialised ~0.4B model of a real architecture (Qwen2.5-0.5B's numbers with SmolLM2's
  49152-token tokenizer: scripts/gpu_check/qwen2_0_4b, config and tokenizer only, the weights drawn here);
- a LoRA step of that model (model.lora.rank=16);
- peak CUDA memory of each run against tokenpo.plan's total at the shapes the run met;
- sampler/trainer log-prob agreement in bf16: the log-probs of sampled tokens as the hf engine's incremental decode
  computes them against the trainer's pass (tokenpo.models.logprobs.response_logprobs);
- tokenpo against TRL's GRPOTrainer, seconds per step (python -m tokenpo.bench --vs-trl), when TRL is installed.
It writes one markdown table (--table, default docs/gpu_check.md).

    python scripts/gpu_check.py                       # on the GPU machine
    python scripts/gpu_check.py --cpu --models tiny   # the same flow on CPU (gloo, fp32): a check of the script
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MODEL_FILES = REPO / "scripts" / "gpu_check" / "qwen2_0_4b"
SHAPES = ["data=arith", "data.prompts_per_step=8", "rollout.group_size=8", "rollout.max_new_tokens=128",
          "eval.max_problems=8", "eval.before_training=false", "trainer.max_steps=3", "trainer.print_samples=0",
          "trainer.worst_case_first=true", "logger.mode=disabled", "reward.num_workers=2"]
WORST_CASE = re.compile(r"worst case first: forward \+ backward of \d+ sequences x \((\d+) \+ (\d+)\) tokens")
GIB = 2**30


def model_overrides(name: str, folder: Path) -> list[str]:
    if name == "tiny":
        return ["model=tiny"]
    return ["model=qwen2_5_7b", "model.name=qwen2_0_4b", "model.source=local", f"model.path={folder}",
            "model.dtype=bfloat16"]


def random_model(folder: Path) -> Path:
    """The ~0.4B model with weights drawn from its config's initialisation (seed 0), saved with its tokenizer."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    if (folder / "model.safetensors").is_file():
        return folder
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(MODEL_FILES), dtype=torch.bfloat16)
    model.save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(MODEL_FILES / name, folder / name)
    return folder


def train(label: str, overrides: list[str], out: Path, timeout_s: float) -> dict:
    """`python -m tokenpo.train` in a subprocess: median step time of steps 2-3, peak CUDA memory, the worst-case
    shapes it met; or its one error line."""
    run_dir = out / label
    start = time.perf_counter()
    result = {"label": label, "overrides": overrides}
    try:
        proc = subprocess.run([sys.executable, "-m", "tokenpo.train", *overrides, f"hydra.run.dir={run_dir}"],
                              cwd=REPO, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return result | {"error": f"timed out after {timeout_s:.0f} s"}
    result["seconds"] = time.perf_counter() - start
    log = proc.stdout + proc.stderr
    (out / f"{label}.log").write_text(log)
    if proc.returncode != 0:
        errors = [line for line in log.splitlines() if "error" in line.lower()]
        result["error"] = (errors or log.splitlines() or ["no output"])[-1][:300]
        return result
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = [s for s in steps if s["step"] > 0]
    result["step_s"] = statistics.median(s["timing/step_s"] for s in steps[1:] or steps)
    result["allocated"] = steps[-1].get("memory/cuda_peak_allocated_bytes")
    result["reserved"] = steps[-1].get("memory/cuda_peak_reserved_bytes")
    met = WORST_CASE.search(log)
    result["prompt_tokens"] = int(met.group(1)) if met else None
    return result


def planned(overrides: list[str], prompt_tokens: int | None, device: str) -> dict:
    from tokenpo.plan import build_plan
    from tokenpo.plan.cli import compose_train_config

    plan = build_plan(compose_train_config(overrides), 1, None, prompt_tokens, device=device)
    runtime = next(part.bytes for part in plan.parts if part.name == "runtime")
    return {"total": plan.total_bytes, "tensors": plan.total_bytes - runtime}


def sampler_logprobs(model, prompt_ids, mask, tokens):
    """Log-probs of the sampled tokens as incremental decoding computes them (prefill, then one token at a time
    over the KV cache, as tokenpo.rollout.hf.generate_hf runs)."""
    import torch
    from transformers import DynamicCache

    from tokenpo.models.logprobs import kv_cache, position_ids_from_mask

    cache = DynamicCache()
    out = model(input_ids=prompt_ids, attention_mask=mask, position_ids=position_ids_from_mask(mask),
                **kv_cache(model, cache), use_cache=True)
    logits, position, logps = out.logits[:, -1], mask.sum(-1), []
    for t in range(tokens.shape[1]):
        logps.append(torch.log_softmax(logits.float(), -1).gather(1, tokens[:, t : t + 1]).squeeze(1))
        mask = torch.cat([mask, mask.new_ones(len(mask), 1)], 1)
        out = model(input_ids=tokens[:, t : t + 1], attention_mask=mask, position_ids=position[:, None],
                    **kv_cache(model, cache), use_cache=True)
        logits, position = out.logits[:, -1], position + 1
    return torch.stack(logps, 1)


def logprob_agreement(folder: Path, device: str, dtype_name: str, group_size: int, new_tokens: int) -> dict:
    """Sampler (incremental decode) against trainer (response_logprobs) log-probs of 2 x G sampled responses."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tokenpo.algorithms.rollout_correction import sampler_mismatch
    from tokenpo.models.logprobs import left_pad, response_logprobs
    from tokenpo.rollout.engine import SamplingParams
    from tokenpo.rollout.hf import generate_hf

    dtype = getattr(torch, dtype_name)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).to(device).eval()
    texts = [tokenizer.apply_chat_template([{"role": "user", "content": f"What is {a} + {b}?"}], tokenize=False,
                                           add_generation_prompt=True) for a, b in ((15, 54), (7, 8))]
    prompts = [tokenizer(text, add_special_tokens=False).input_ids for text in texts]
    generator = torch.Generator(device).manual_seed(0)
    g = group_size
    with torch.no_grad():
        responses = generate_hf(model, prompts, SamplingParams(g, new_tokens), tokenizer.pad_token_id,
                                generator).token_ids
        ids, mask = (t.to(device) for t in left_pad(prompts, tokenizer.pad_token_id))
        width = max(map(len, responses))
        tokens = torch.full((len(responses), width), tokenizer.pad_token_id, device=device)
        real = torch.zeros(len(responses), width, device=device)
        for row, response in enumerate(responses):
            tokens[row, : len(response)] = torch.tensor(response, device=device)
            real[row, : len(response)] = 1
        sampled = sampler_logprobs(model, ids.repeat_interleave(g, 0), mask.repeat_interleave(g, 0), tokens)
        trained, _ = response_logprobs(model, ids, mask, tokens, real, group_size=g, with_entropy=False)
    metrics = sampler_mismatch(trained, sampled, real)
    return {key: float(value) for key, value in metrics.items()} | {"tokens": int(real.sum()), "dtype": dtype_name}


def trl_comparison(out: Path) -> dict:
    if importlib.util.find_spec("trl") is None:
        return {"error": "skipped: TRL is not installed (trl + datasets + pyarrow are over the 64 MiB a GPU slot "
                         "receives; scripts/gpu_wheels.sh)"}
    path = out / "bench_vs_trl.json"
    proc = subprocess.run([sys.executable, "-m", "tokenpo.bench", "--vs-trl", "--model", "tiny", "--prompts", "8",
                           "--group-size", "8", "--max-new-tokens", "128", "--beta", "0", "--steps", "3",
                           "--override", "deepspeed.precision=bf16", "--override", "deepspeed.backend=nccl",
                           "--out", str(path)], cwd=REPO, capture_output=True, text=True, timeout=240)
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or ["failed"])[-1][:300]}
    result = json.loads(path.read_text())
    return {"tokenpo_step_s": result["tokenpo"]["median_step_s"], "trl_step_s": result["trl"]["median_step_s"]}


def gib(value) -> str:
    return "-" if value is None else f"{value / GIB:.2f}"


def table(device_name: str, runs: list[dict], agreement: dict, trl: dict) -> str:
    lines = [f"# GPU check (scripts/check_gpu.sh)\n\n{device_name}; one process; 8 prompts x 8 responses x 128 "
             "tokens, 3 steps, worst case first. Peak CUDA memory (torch's allocated / reserved) against the memory "
             "plan's tensors (its total less the runtime part) at the prompt length the worst-case pass met.\n",
             "| run | result | median step (s) | peak allocated (GiB) | peak reserved (GiB) | plan tensors (GiB) "
             "| plan vs reserved |", "|---|---|---:|---:|---:|---:|---:|"]
    for run in runs:
        if "error" in run:
            lines.append(f"| {run['label']} | {run['error']} | | | | | |")
            continue
        plan = run.get("plan", {}).get("tensors")
        error = f"{100 * (plan - run['reserved']) / run['reserved']:+.0f} %" if plan and run["reserved"] else "-"
        lines.append(f"| {run['label']} | ok | {run['step_s']:.2f} | {gib(run['allocated'])} | "
                     f"{gib(run['reserved'])} | {gib(plan)} | {error} |")
    if "error" in agreement:
        lines.append(f"\nSampler/trainer log-probs (bf16): {agreement['error']}")
    else:
        lines.append(f"\nSampler/trainer log-probs ({agreement['dtype']}, {agreement['tokens']} sampled tokens of the "
                     "~0.4B model): " + ", ".join(f"{k} {v:.3g}" for k, v in agreement.items()
                                                  if k not in ("tokens", "dtype")))
    if "error" in trl:
        lines.append(f"\ntokenpo vs TRL GRPOTrainer: {trl['error']}")
    else:
        lines.append(f"\ntokenpo vs TRL GRPOTrainer (tiny model, same work): {trl['tokenpo_step_s']:.2f} s vs "
                     f"{trl['trl_step_s']:.2f} s per step")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "outputs" / "check_gpu")
    parser.add_argument("--table", type=Path, default=REPO / "docs" / "gpu_check.md")
    parser.add_argument("--models", nargs="+", default=["tiny", "qwen2_0_4b"])
    parser.add_argument("--stages", nargs="+", type=int, default=[0, 2, 3])
    parser.add_argument("--cpu", action="store_true", help="gloo and fp32 on CPU: checks this script, not a GPU")
    parser.add_argument("--timeout", type=float, default=150, help="seconds per training run")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("WANDB_MODE", "disabled")
    device = "cpu" if args.cpu else "cuda"
    precision = ["deepspeed.precision=fp32", "deepspeed.backend=gloo"] if args.cpu else [
        "deepspeed.precision=bf16", "deepspeed.backend=nccl"]
    if args.cpu:
        device_name = "CPU (a check of the script)"
    else:
        import torch

        props = torch.cuda.get_device_properties(0)
        device_name = f"{props.name}, {props.total_memory / GIB:.0f} GiB, torch {torch.__version__}"
    folder = random_model(args.out / "qwen2_0_4b")
    runs = []
    for name in args.models:
        for stage in args.stages:
            overrides = [*SHAPES, *model_overrides(name, folder), f"deepspeed=zero{stage}", *precision]
            runs.append(train(f"{name} ZeRO {stage}", overrides, args.out, args.timeout))
    if "qwen2_0_4b" in args.models:
        overrides = [*SHAPES, *model_overrides("qwen2_0_4b", folder), "deepspeed=zero2", "model.lora.rank=16",
                     *precision]
        runs.append(train("qwen2_0_4b ZeRO 2 LoRA r16", overrides, args.out, args.timeout))
    for run in runs:
        if "error" not in run:
            run["plan"] = planned(run["overrides"], run["prompt_tokens"], device)
    try:
        # bf16 matmuls crawl on CPUs without bf16 units: the CPU flow checks the code in fp32, on fewer tokens
        agreement = (logprob_agreement(folder, device, "float32", 2, 16) if args.cpu
                     else logprob_agreement(folder, device, "bfloat16", 8, 64))
    except Exception as err:  # a failed part of the check is a row, not the end of the check
        agreement = {"error": f"failed: {type(err).__name__}: {err}"[:300]}
    trl = {"error": "skipped on CPU"} if args.cpu else trl_comparison(args.out)
    (args.out / "runs.json").write_text(json.dumps({"runs": runs, "agreement": agreement, "trl": trl}, indent=1))
    text = table(device_name, runs, agreement, trl)
    args.table.write_text(text)
    print(text)


if __name__ == "__main__":
    main()

"""The GPU check's parts, one per process (scripts/gpu_check/harness.py runs them, each under its own timeout):

    python scripts/gpu_check/parts.py <part> --device cuda|cpu --out <folder> --work <folder> --result <file.json>

Every part trains through tokenpo's public command line (`python -m tokenpo.train` and its config keys), so it checks
whatever the package does at the time it runs. --device cpu runs the same parts at small sizes with gloo and fp32:
a check of the harness and the parts, not of a GPU.

Models (weights drawn here, seed 0; config and tokenizer from scripts/gpu_check/qwen2_0_4b, SmolLM2's 49152-token
tokenizer):
- qwen2_0_4b: Qwen2.5-0.5B's architecture (896 wide, 24 layers) with a 49152-token vocabulary, ~0.36B parameters;
- vocab152k: the same width with 4 layers and Qwen2.5's 152064-row output layer (embeddings tied, ~0.18B): the
  tokenizer has 49152 tokens, so sampled ids above it decode to nothing, as Qwen2.5's 151665 tokens under its
  152064 rows do. On CPU both are 64 wide with 2 layers (the 152064 rows kept).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
MODEL_FILES = HERE / "qwen2_0_4b"
WORST_CASE = re.compile(r"worst case first: forward \+ backward of \d+ sequences x \((\d+) \+ (\d+)\) tokens")
RESUMED = re.compile(r"resumed from (\S+) at step (\d+)")
ONE_LINE_ERROR = re.compile(r"^tokenpo: error: .+", re.M)
GIB = 2**30


@dataclass(frozen=True)
class Sizes:
    """What differs between the GPU check and its CPU rehearsal."""

    device: str
    # bf16 with NCCL on CUDA; fp32 with gloo on CPU (bf16 matmuls crawl on CPUs without bf16 units)
    precision: tuple[str, ...]
    model_dtype: str
    prompts: int
    group: int
    new_tokens: int
    # the 152k-vocabulary part's sequences
    long_prompts: int
    long_group: int
    long_new_tokens: int
    # width/depth of the drawn models (None: the config's own, Qwen2.5-0.5B's)
    shrink: dict | None


GPU = Sizes("cuda", ("deepspeed.precision=bf16", "deepspeed.backend=nccl"), "bfloat16", prompts=8, group=8,
            new_tokens=128, long_prompts=2, long_group=4, long_new_tokens=2048, shrink=None)
CPU = Sizes("cpu", ("deepspeed.precision=fp32", "deepspeed.backend=gloo"), "float32", prompts=2, group=2,
            new_tokens=8, long_prompts=1, long_group=2, long_new_tokens=64,
            shrink={"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
                    "num_key_value_heads": 2})


def run_shape(sizes: Sizes, steps: int, prompts: int | None = None, group: int | None = None,
              new_tokens: int | None = None, precision: tuple[str, ...] | None = None) -> list[str]:
    """The overrides every training run of the check shares: built-in arithmetic, the worst case first, a one-problem
    evaluation of 8 tokens after training only, no W&B."""
    return ["data=arith", f"data.prompts_per_step={prompts or sizes.prompts}",
            f"rollout.group_size={group or sizes.group}", f"rollout.max_new_tokens={new_tokens or sizes.new_tokens}",
            "eval.max_problems=1", "eval.max_new_tokens=8", "eval.before_training=false",
            f"trainer.max_steps={steps}", "trainer.print_samples=0", "trainer.worst_case_first=true",
            "logger.mode=disabled", "reward.num_workers=2", *(precision or sizes.precision)]


# ---------------------------------------------------------------------------------------------------------- models


def drawn_model(work: Path, name: str, sizes: Sizes, changes: dict) -> Path:
    """A model folder under work/models/: the config of scripts/gpu_check/qwen2_0_4b with `changes` (and the CPU's
    shrink), weights drawn with seed 0, its tokenizer; reused when already there (parts share them)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    folder = work / "models" / name
    if (folder / "config.json").is_file():
        return folder
    # built from the changed dict, not changed after: values derived at construction (layer_types) follow them
    values = json.loads((MODEL_FILES / "config.json").read_text()) | changes | (sizes.shrink or {})
    config = AutoConfig.for_model(**values)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, sizes.model_dtype))
    # written beside, then renamed: a part killed mid-save leaves no folder that looks complete
    partial = folder.with_name(name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    model.save_pretrained(partial)
    for file in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(MODEL_FILES / file, partial / file)
    os.replace(partial, folder)
    return folder


def qwen2_0_4b(work: Path, sizes: Sizes) -> Path:
    return drawn_model(work, "qwen2_0_4b", sizes, {})


def vocab152k(work: Path, sizes: Sizes) -> Path:
    # Qwen2.5's output rows (config.json of Qwen/Qwen2.5-0.5B: vocab_size 152064); 4 layers keep 2k-token decoding short
    return drawn_model(work, "vocab152k", sizes, {"vocab_size": 152064, "num_hidden_layers": 4})


def local_model(folder: Path, sizes: Sizes) -> list[str]:
    # qwen2_5_7b's keys (a Qwen2.5 model from a local folder), with the drawn weights
    return ["model=qwen2_5_7b", f"model.name={folder.name}", "model.source=local", f"model.path={folder}",
            f"model.dtype={sizes.model_dtype}", "model.gradient_checkpointing=false"]


# -------------------------------------------------------------------------------------------------- training runs


@dataclass
class TrainRun:
    """One `tokenpo.train` process: what it was given, what it measured, or its error line."""

    label: str
    overrides: list[str]
    returncode: int | None = None
    seconds: float | None = None
    error: str | None = None
    # median of steps 2.. (step 1 when there is one step)
    step_s: float | None = None
    peak_allocated: float | None = None
    peak_reserved: float | None = None
    # the training process's own peak resident memory (wait4's ru_maxrss; nproc=1: the one rank)
    host_rss: float | None = None
    prompt_tokens: int | None = None
    resumed_at: int | None = None
    steps: list[dict] = field(default_factory=list)


def peak_rss_wait(proc: subprocess.Popen) -> tuple[int, float]:
    """Wait for `proc`; its exit status and its peak resident bytes (Linux reports KiB)."""
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, usage.ru_maxrss * 1024.0


def train(label: str, overrides: list[str], run_dir: Path, out: Path, entry: list[str] | None = None) -> TrainRun:
    """`python -m tokenpo.train` (or `entry`) with `overrides` in run_dir; its log goes to out/<label>.log as it runs
    and a summary to this part's log."""
    run = TrainRun(label, overrides)
    log = out / f"{label}.log"
    start = time.perf_counter()
    with log.open("w") as stream:
        proc = subprocess.Popen([sys.executable, *(entry or ["-m", "tokenpo.train"]), *overrides,
                                 f"hydra.run.dir={run_dir}"], cwd=REPO, stdout=stream, stderr=subprocess.STDOUT)
        run.returncode, run.host_rss = peak_rss_wait(proc)
    run.seconds = time.perf_counter() - start
    text = log.read_text(errors="replace")
    metrics = run_dir / "metrics.jsonl"
    lines = metrics.read_text().splitlines() if metrics.exists() else []
    run.steps = [json.loads(line) for line in lines if line.strip()]
    if run.returncode != 0:
        errors = ONE_LINE_ERROR.findall(text) or [line for line in text.splitlines() if "error" in line.lower()]
        run.error = (errors or text.splitlines() or ["no output"])[-1][:300]
    elif run.steps:
        timed = [s["timing/step_s"] for s in run.steps if "timing/step_s" in s]
        run.step_s = statistics.median(timed[1:] or timed) if timed else None
        run.peak_allocated = run.steps[-1].get("memory/cuda_peak_allocated_bytes")
        run.peak_reserved = run.steps[-1].get("memory/cuda_peak_reserved_bytes")
    met, resumed = WORST_CASE.search(text), RESUMED.search(text)
    run.prompt_tokens = int(met.group(1)) if met else None
    run.resumed_at = int(resumed.group(2)) if resumed else None
    print(f"{label}: exit {run.returncode} in {run.seconds:.0f} s, steps {[s['step'] for s in run.steps]}"
          f"{', ' + run.error if run.error else ''}", flush=True)
    return run


def gib(value: float | None) -> str:
    return "-" if value is None else f"{value / GIB:.2f}"


def measured(run: TrainRun) -> str:
    step = "-" if run.step_s is None else f"{run.step_s:.2f}"
    return (f"{step} s/step, CUDA peak {gib(run.peak_allocated)} allocated / {gib(run.peak_reserved)} reserved GiB, "
            f"host RSS {gib(run.host_rss)} GiB")


@dataclass
class Findings:
    """What a part writes to its result file: ok, the table's one-line summary, and its runs and figures."""

    ok: bool
    summary: str
    runs: list[TrainRun] = field(default_factory=list)
    figures: dict = field(default_factory=dict)


def failed_run(runs: list[TrainRun]) -> Findings | None:
    """The findings of the first run that failed, if any."""
    bad = next((run for run in runs if run.returncode != 0 or not run.steps), None)
    return None if bad is None else Findings(False, f"{bad.label}: {bad.error or 'no steps recorded'}", runs)


# ---------------------------------------------------------------------------------------------------------- parts


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def device(sizes: Sizes, out: Path, work: Path) -> Findings:
    """The device and a process group of one over the backend tokenpo uses there (an all-reduce of known values), then
    a one-step tokenpo run of the tiny model through tokenpo's own device and process-group set-up."""
    import torch
    import torch.distributed as dist

    figures = {"torch": torch.__version__}
    if sizes.device == "cuda":
        props = torch.cuda.get_device_properties(0)
        figures |= {"name": props.name, "memory_gib": round(props.total_memory / GIB, 1),
                    "capability": f"{props.major}.{props.minor}", "cuda": torch.version.cuda,
                    "nccl": str(torch.cuda.nccl.version()), "bf16": torch.cuda.is_bf16_supported()}
    backend = "nccl" if sizes.device == "cuda" else "gloo"
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    values = torch.arange(4.0, device=sizes.device)
    dist.all_reduce(values)
    dist.destroy_process_group()
    figures["all_reduce"] = values.tolist()
    run = train("device_tiny", ["model=tiny", f"model.dtype={sizes.model_dtype}", "deepspeed=zero0",
                                *run_shape(sizes, 1)], work / "runs" / "device_tiny", out)
    environment = work / "runs" / "device_tiny" / "environment.json"
    figures["tokenpo_environment"] = json.loads(environment.read_text())[-1] if environment.exists() else None
    failure = failed_run([run])
    if failure:
        return replace(failure, figures=figures)
    ok = figures["all_reduce"] == [0.0, 1.0, 2.0, 3.0] and (sizes.device == "cpu" or figures["bf16"])
    where = figures.get("name", "CPU")
    return Findings(ok, f"{where}, torch {figures['torch']}, {backend} all-reduce {figures['all_reduce']}; tiny "
                        f"model 1 step: {run.seconds:.0f} s", [run], figures)


def zero3_lora_resume(sizes: Sizes, out: Path, work: Path) -> Findings:
    """ZeRO-3 + LoRA (rank 16) + gradient checkpointing + recompute_head of the ~0.4B model: 2 steps saving a
    checkpoint each, then the same run dir to 3 steps, which must resume at step 2 and run only step 3."""
    folder = qwen2_0_4b(work, sizes)
    overrides = [*local_model(folder, sizes), "deepspeed=zero3", "model.lora.rank=16",
                 "model.gradient_checkpointing=true", "trainer.recompute_head=true", "trainer.save_every=1"]
    run_dir = work / "runs" / "zero3_lora"
    first = train("zero3_lora_steps_1_2", [*overrides, *run_shape(sizes, 2)], run_dir, out)
    failure = failed_run([first])
    if failure:
        return failure
    second = train("zero3_lora_resume_3", [*overrides, *run_shape(sizes, 3)], run_dir, out)
    failure = failed_run([first, second])
    if failure:
        return failure
    new_steps = [s["step"] for s in second.steps if s["step"] > 2]
    ok = second.resumed_at == 2 and new_steps == [3]
    return Findings(ok, f"resumed at step {second.resumed_at}, then steps {new_steps}; {measured(first)}",
                    [first, second])


def vocab152k_2k(sizes: Sizes, out: Path, work: Path) -> Findings:
    """A 152064-row output layer with 2048-token responses (GPU), recompute_head on, ZeRO 2, 2 steps."""
    folder = vocab152k(work, sizes)
    run = train("vocab152k_2k", [*local_model(folder, sizes), "deepspeed=zero2", "trainer.recompute_head=true",
                                 *run_shape(sizes, 2, sizes.long_prompts, sizes.long_group, sizes.long_new_tokens)],
                work / "runs" / "vocab152k_2k", out)
    failure = failed_run([run])
    if failure:
        return failure
    longest = max(s.get("response_length/max", 0) for s in run.steps)
    return Findings(True, f"longest response {longest:.0f} tokens; {measured(run)}", [run])


def dapo_dynamic_sampling(sizes: Sizes, out: Path, work: Path) -> Findings:
    """DAPO with dynamic sampling on the ~0.4B model, ZeRO 2; the reward is a coin (coin_reward.py: a quarter of the
    responses right, by their text) so that groups are mixed or all-wrong and some rounds drop groups."""
    folder = qwen2_0_4b(work, sizes)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))
    run = train("dapo_dynamic", [*local_model(folder, sizes), "algorithm=dapo", "deepspeed=zero2",
                                 "reward.fn=coin_reward:verdict", *run_shape(sizes, 2)],
                work / "runs" / "dapo_dynamic", out)
    failure = failed_run([run])
    if failure:
        return failure
    keys = ("rounds", "prompts", "dropped_groups", "mixed_groups", "batch_groups")
    seen = {key: [s.get(f"dynamic_sampling/{key}") for s in run.steps if f"dynamic_sampling/{key}" in s]
            for key in keys}
    ok = all(seen.values()) and all(b == sizes.prompts for b in seen["batch_groups"])
    return Findings(ok, ", ".join(f"{key} {seen[key]}" for key in keys) + f"; {measured(run)}", [run],
                    {"dynamic_sampling": seen})


# (model.dtype, deepspeed.precision) pairs: the first trains (bf16 weights, DeepSpeed's fp32 master copy); the others
# are recorded as they come out (trains, or refused with one `tokenpo: error:` line); a traceback fails the part
DTYPE_PAIRS = (("bfloat16", "bf16"), ("float16", "bf16"), ("float16", "fp32"), ("bfloat16", "fp32"))


def zero3_two_ranks(sizes: Sizes, out: Path, work: Path) -> Findings:
    """ZeRO-3 on 2 processes of the ~0.4B model, responses of unequal lengths and a 16-token output-layer chunk, so
    the ranks' passes differ in length and chunk count (every module call gathers its parameters: a rank that calls
    once more than the other would hang); 2 steps, then the same at ZeRO-2, whose metrics it must equal. NCCL over two
    devices where there are two; on one device both ranks share it over gloo (NCCL refuses two ranks on one GPU)."""
    import torch

    folder = qwen2_0_4b(work, sizes)
    two_devices = sizes.device == "cuda" and torch.cuda.device_count() >= 2
    backend = "deepspeed.backend=nccl" if two_devices else "deepspeed.backend=gloo"
    # fp32 (the CPU rehearsal) agrees to rounding; bf16 sums in another order under each stage
    tolerance = 1e-5 if sizes.model_dtype == "float32" else 2e-2
    shape = [o for o in run_shape(sizes, 2) if not o.startswith("deepspeed.backend")]
    # drawn weights sample near-uniformly and would run every response to the cap: stop tokens enough that a response
    # stops after new_tokens / 3 tokens on average, so lengths differ between rows and between the ranks (at most
    # 3000 ids: Hydra parses a long list slowly, 0.5 ms an id; at the CPU's 8 tokens 6 % of steps stop)
    stops = range(1000, 1000 + min(3000, 3 * 49_152 // sizes.new_tokens))
    common = [*local_model(folder, sizes), "trainer.nproc=2", "trainer.logit_chunk_tokens=16",
              "trainer.dist_timeout_s=120", f"rollout.eos_tokens=[{','.join(map(str, stops))}]", *shape, backend]
    runs = [train(f"{stage}_two_ranks", [*common, f"deepspeed={stage}"], work / "runs" / f"{stage}_two_ranks", out)
            for stage in ("zero3", "zero2")]
    failure = failed_run(runs)
    if failure:
        return failure
    zero3, zero2 = ({key: value for step in run.steps for key, value in step.items()
                     if key.startswith(("loss", "kl/", "grad_norm", "entropy/mean"))} for run in runs)
    apart = {key: (zero3[key], zero2[key]) for key in zero3
             if abs(zero3[key] - zero2[key]) > tolerance * max(abs(zero3[key]), abs(zero2[key]), 1e-8)}
    lengths = [(round(step["response_length/mean"], 1), step["response_length/max"]) for step in runs[0].steps]
    unequal = any(mean < longest for mean, longest in lengths)
    return Findings(not apart and unequal, f"{backend}; response lengths (mean, max) {lengths}; ZeRO-3 vs ZeRO-2 "
                               + (f"apart: {apart}" if apart else f"agree on {sorted(zero3)}") + f"; {measured(runs[0])}",
                    runs, {"apart": apart})


def outcome(run: TrainRun, text: str) -> str:
    if run.returncode == 0 and run.steps:
        return "trains"
    refused = ONE_LINE_ERROR.findall(text)
    return f"refused: {refused[-1]}" if refused else f"crashed: {run.error}"


def dtypes(sizes: Sizes, out: Path, work: Path) -> Findings:
    """The tiny model with GRPO's KL to a reference (kl_coef 0.04) at each dtype pair: at step 1 policy and
    reference are the same weights, so kl/ref and loss/kl must be exactly 0."""
    backend = next(o for o in sizes.precision if o.startswith("deepspeed.backend"))
    runs, outcomes = [], {}
    for model_dtype, precision in DTYPE_PAIRS:
        label = f"dtype_{model_dtype}_{precision}"
        run = train(label, ["model=tiny", f"model.dtype={model_dtype}", "deepspeed=zero2",
                            *run_shape(sizes, 1, precision=(f"deepspeed.precision={precision}", backend))],
                    work / "runs" / label, out)
        runs.append(run)
        outcomes[f"{model_dtype}+{precision}"] = outcome(run, (out / f"{label}.log").read_text(errors="replace"))
    first = runs[0].steps[0] if runs[0].steps else {}
    kl = (first.get("kl/ref"), first.get("loss/kl"))
    ok = kl == (0.0, 0.0) and not any(o.startswith("crashed") for o in outcomes.values())
    return Findings(ok, f"bfloat16+bf16 step 1 kl/ref {kl[0]}, loss/kl {kl[1]}; "
                        + "; ".join(f"{pair}: {o}" for pair, o in outcomes.items()), runs, {"outcomes": outcomes})


def memory_phases(sizes: Sizes, out: Path, work: Path) -> Findings:
    """The hf engine on the ~0.4B model, ZeRO 0, worst case first, 2 steps, with every torch.cuda.empty_cache call
    recorded in order (record_phases.py): which tokenpo function made it and the reserved bytes before and after."""
    folder = qwen2_0_4b(work, sizes)
    events = out / "memory_phases.jsonl"
    events.unlink(missing_ok=True)
    os.environ["GPU_CHECK_PHASES"] = str(events)
    run = train("memory_phases", [*local_model(folder, sizes), "deepspeed=zero0", "rollout=hf", *run_shape(sizes, 2)],
                work / "runs" / "memory_phases", out, entry=[str(HERE / "record_phases.py")])
    failure = failed_run([run])
    if failure:
        return failure
    calls = [json.loads(line) for line in events.read_text().splitlines()] if events.exists() else []
    order = [f"{c['caller']} {gib(c['reserved_before'])}->{gib(c['reserved_after'])}" for c in calls]
    ok = bool(calls) or sizes.device == "cpu"
    return Findings(ok, f"{len(calls)} empty_cache calls (GiB reserved before->after): " + "; ".join(order[:12]),
                    [run], {"calls": calls})


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


def logprobs(sizes: Sizes, out: Path, work: Path) -> Findings:
    """Sampler (incremental decode) against trainer (response_logprobs) log-probs of 2 x G sampled responses of the
    ~0.4B model in the check's dtype."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tokenpo.algorithms.rollout_correction import sampler_mismatch
    from tokenpo.models.logprobs import PassOptions, left_pad, response_logprobs
    from tokenpo.rollout.engine import SamplingParams
    from tokenpo.rollout.hf import generate_hf

    folder = qwen2_0_4b(work, sizes)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, sizes.model_dtype)).to(sizes.device)
    model.eval()
    texts = [tokenizer.apply_chat_template([{"role": "user", "content": f"What is {a} + {b}?"}], tokenize=False,
                                           add_generation_prompt=True) for a, b in ((15, 54), (7, 8))]
    prompts = [tokenizer(text, add_special_tokens=False).input_ids for text in texts]
    g, pad = sizes.group, tokenizer.pad_token_id
    with torch.no_grad():
        responses = generate_hf(model, prompts, SamplingParams(g, sizes.new_tokens // 2), pad,
                                torch.Generator(sizes.device).manual_seed(0)).token_ids
        ids, mask = (t.to(sizes.device) for t in left_pad(prompts, pad))
        width = max(map(len, responses))
        tokens = torch.full((len(responses), width), pad, device=sizes.device)
        real = torch.zeros(len(responses), width, device=sizes.device)
        for row, response in enumerate(responses):
            tokens[row, : len(response)] = torch.tensor(response, device=sizes.device)
            real[row, : len(response)] = 1
        sampled = sampler_logprobs(model, ids.repeat_interleave(g, 0), mask.repeat_interleave(g, 0), tokens)
        # each prompt's G responses in a row, as the trainer lays a group out
        rows_prompt = torch.arange(len(prompts), device=sizes.device).repeat_interleave(g)
        trained, _ = response_logprobs(model, ids, mask, tokens, real, prompt_index=rows_prompt,
                                       options=PassOptions(with_entropy=False))
    figures = {key: float(value) for key, value in sampler_mismatch(trained, sampled, real).items()}
    return Findings(True, f"{sizes.model_dtype}, {int(real.sum())} sampled tokens: "
                          + ", ".join(f"{k} {v:.3g}" for k, v in figures.items()), figures=figures)


def peak_vs_plan(sizes: Sizes, out: Path, work: Path) -> Findings:
    """Each earlier part's training runs: CUDA peak reserved against tokenpo.plan's tensors (its total less the
    runtime part) at the prompt length the worst-case pass met."""
    from tokenpo.errors import ConfigError
    from tokenpo.plan import build_plan
    from tokenpo.plan.cli import compose_train_config

    lines, figures = [], {}
    for result in sorted(out.glob("*.result.json")):
        for run in json.loads(result.read_text()).get("runs", []):
            if run["returncode"] != 0 or not run["steps"]:
                continue
            try:
                plan = build_plan(compose_train_config(run["overrides"]), 1, None, run["prompt_tokens"],
                                  device=sizes.device)
            except ConfigError as err:  # one run's plan failing leaves the others' comparisons standing
                lines.append(f"{run['label']} no plan: {err}"[:200])
                continue
            tensors = plan.total_bytes - next(part.bytes for part in plan.parts if part.name == "runtime")
            reserved = run["peak_reserved"]
            error = f"{100 * (tensors - reserved) / reserved:+.0f} %" if reserved else "no CUDA peak"
            figures[run["label"]] = {"plan_tensors": tensors, "plan_total": plan.total_bytes, "reserved": reserved}
            lines.append(f"{run['label']} plan {gib(tensors)} vs reserved {gib(reserved)} GiB ({error})")
    return Findings(bool(figures), "; ".join(lines) or "no finished training run to compare", figures=figures)


PARTS = {part.__name__: part for part in (device, zero3_lora_resume, zero3_two_ranks, vocab152k_2k,
                                          dapo_dynamic_sampling, dtypes, memory_phases, logprobs, peak_vs_plan)}


def main() -> None:
    parser = argparse.ArgumentParser(description="one part of the GPU check")
    parser.add_argument("part", choices=sorted(PARTS))
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--work", type=Path, required=True, help="models and run dirs (GBs; not the output folder)")
    parser.add_argument("--result", type=Path, required=True)
    args = parser.parse_args()
    os.environ.setdefault("WANDB_MODE", "disabled")
    findings = PARTS[args.part](GPU if args.device == "cuda" else CPU, args.out, args.work)
    args.result.write_text(json.dumps(asdict(findings), indent=1))
    print(findings.summary, flush=True)
    sys.exit(0 if findings.ok else 1)


if __name__ == "__main__":
    main()

"""The RL loop: sample prompts -> generate G responses -> reward -> advantages -> clipped policy update."""

from __future__ import annotations

import contextlib
import json
import logging
import signal
import time
from pathlib import Path

import torch

from tokenpo import algorithms as alg
from tokenpo.config import TrainConfig
from tokenpo.data import DataConfig, Example, PromptSampler, describe_template, load_splits
from tokenpo.deepspeed import dist
from tokenpo.deepspeed.engine import build_policy_engine, build_reference, partitioned_loading
from tokenpo.deepspeed.export import export_hf
from tokenpo.evaluation.benchmark import Benchmark, load_benchmark
from tokenpo.evaluation.config import EvalConfig
from tokenpo.evaluation.run import TextSampler, evaluate_benchmark, sample_lines
from tokenpo.logger.run_logger import SAMPLES_FILE, RunLogger, samples_due
from tokenpo.logger.samples import eval_rows, rollout_rows
from tokenpo.models.loading import load_model
from tokenpo.plan.memory import with_vllm_share
from tokenpo.rewards import RewardScorer
from tokenpo.rollout.engine import build_engine
from tokenpo.trainer import checkpoint
from tokenpo.trainer.context import RunContext, Timings
from tokenpo.trainer.environment import record_environment
from tokenpo.trainer.launch import STOP_SIGNALS
from tokenpo.trainer.optim import build_optimizer, set_step_lr
from tokenpo.trainer.rollouts import collect_rollouts, dynamic_sampling_metrics
from tokenpo.trainer.update import train_on_rollouts
from tokenpo.trainer.worst_case import (cuda_memory_metrics, out_of_memory_reported, run_worst_case, step_shapes,
                                        worst_case_enabled)

log = logging.getLogger("tokenpo")


def eval_benchmark(ctx: RunContext, bench: EvalConfig, eval_examples: list[Example], data_cfg: DataConfig,
                   step: int):
    """Judged as `tokenpo.evaluate` judges the benchmark (benchmark_reward), not with the training reward."""
    cfg = ctx.cfg
    result = evaluate_benchmark(Benchmark(bench, eval_examples, data_cfg), cfg.reward, cfg.rollout,
                                TextSampler(ctx.generate, ctx.tokenizer), cfg.seed + step, ctx.scorer)
    metrics, records = result.metrics, result.records
    flat = {f"eval/{bench.name}/{k}": v for k, v in metrics.items()}
    if bench is cfg.eval:  # the main benchmark's accuracy is the run's headline number
        flat["eval/accuracy"] = metrics["accuracy"]
    return flat, records


def evaluate_benchmarks(ctx: RunContext, benchmarks: list, step: int, run_dir: Path, stem: str | None,
                        logger: RunLogger) -> dict:
    """Every benchmark (eval, then eval.extra) at this step: their metrics merged, their responses as sample tables;
    with `stem`, each one's records into <stem>.json (the main benchmark) or <stem>.<name>.json."""
    merged = {}
    for bench, examples, data_cfg in benchmarks:
        metrics, records = eval_benchmark(ctx, bench, examples, data_cfg, step)
        merged.update(metrics)
        logger.log_samples(step, f"eval/{bench.name}", eval_rows(step, bench.name, records,
                                                                 ctx.cfg.logger.samples_rows))
        if stem is not None:
            main = bench is ctx.cfg.eval
            if main:
                report_samples(stem.replace("eval_", "") + " training", records, ctx.cfg.trainer.print_samples)
            write_eval(run_dir / (f"{stem}.json" if main else f"{stem}.{bench.name}.json"), metrics, records)
    return merged


class StopRequest:
    """A stop signal (SIGTERM, SIGINT, SIGUSR1, SIGUSR2) asks the loop to save and exit at the end of the current step.
    `restore` puts back the handlers the process had before (submitit's SIGUSR2 handler, which requeues the job)."""

    def __init__(self) -> None:
        self.requested = False
        self.signum: int | None = None
        self.previous = {sig: signal.signal(sig, self._handle) for sig in STOP_SIGNALS}

    def _handle(self, signum, frame) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested, self.signum = True, signum
        log.warning("signal %d: saving a checkpoint after this step, then exiting", signum)

    def restore(self) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)


def train(cfg: TrainConfig, run_dir: Path, run_name: str, group: str, resolved: dict) -> dict:
    if cfg.trainer.threads:
        torch.set_num_threads(cfg.trainer.threads)
    dist.init_distributed(cfg.deepspeed.backend, cfg.trainer.dist_timeout_s)
    cfg.validate_batch(dist.world_size())
    torch.manual_seed(cfg.seed)
    sizes = dict(micro_batch_size=cfg.trainer.micro_batch_size, max_grad_norm=cfg.trainer.max_grad_norm,
                 world_size=dist.world_size())
    partitioned = partitioned_loading(cfg.deepspeed, **sizes)
    tokenizer, model = load_model(cfg.model, cfg.seed, partitioned)
    device = dist.device()
    reference = None
    # a LoRA policy is its own reference, with its adapters off (RunContext.reference_model): no second copy
    if alg.needs_reference(cfg.algorithm) and not cfg.model.lora.enabled:
        reference = build_reference(model, cfg.deepspeed, **sizes,
                                    load_initial=lambda: load_model(cfg.model, cfg.seed, partitioned)[1])
        reference.to(device)
    optimizer = build_optimizer(model, cfg.trainer)
    policy = build_policy_engine(model, optimizer, cfg.deepspeed, **sizes)
    train_examples, train_eval = load_splits(cfg.data, cfg.seed, tokenizer)
    benchmarks = [(bench, *load_benchmark(bench, cfg.data, cfg.seed, tokenizer, train_eval, train_examples, key))
                  for bench, key in zip(cfg.eval.benchmarks(), cfg.eval.data_keys())]
    benchmarks = [(bench, examples, data_cfg) for bench, examples, data_cfg in benchmarks if examples]
    sampler = PromptSampler(train_examples, cfg.data.prompts_per_step, cfg.seed)
    stop = StopRequest()
    with RewardScorer(cfg.reward_for(cfg.data)) as scorer, \
            contextlib.closing(build_engine(with_vllm_share(cfg, dist.world_size()), policy, tokenizer,
                                            cfg.deepspeed)) as rollout_engine:
        ctx = RunContext.create(cfg, run_dir, tokenizer, policy, reference, scorer, sampler, device,
                                rollout_engine=rollout_engine)
        start_step, wandb_id, history = 0, None, {}
        resume_dir = checkpoint.find_resume_dir(cfg.trainer.resume, run_dir,
                                                with_checksums=cfg.trainer.verify_checkpoints == "full")
        checkpoint.set_aside_stale(run_dir / "checkpoints", resume_dir)
        if resume_dir is not None:
            state = checkpoint.load(policy, resume_dir, cfg.model.lora.settings())
            start_step, wandb_id, history = state["step"], state.get("wandb_id"), state.get("history", {})
            sampler.load_state_dict(state["sampler"])
            log.info("resumed from %s at step %d", resume_dir, start_step)
        # steps after the checkpoint (or a whole earlier attempt) are logged again below
        for log_file in ("metrics.jsonl", SAMPLES_FILE):
            checkpoint.trim_metrics(run_dir / log_file, start_step if resume_dir is not None else -1)
        logger = RunLogger(cfg.logger, run_dir, enabled=dist.is_main(), run_name=run_name, group=group,
                           config=resolved, resume_id=wandb_id)
        if dist.is_main():
            record_environment(run_dir, start_step, dist.world_size())
            log.info("run dir: %s", run_dir)
            log.info("prompt template: %s", describe_template(cfg.data.template, tokenizer))
        # the engine's weights are the initial policy's until a sync: stale after a resume
        engine_stale = resume_dir is not None
        if start_step < cfg.trainer.max_steps and worst_case_enabled(cfg, device):
            rollout_engine.sleep()  # the pass checks the update's shapes with the memory the update will have
            run_worst_case(ctx, train_examples)
            engine_stale = True  # asleep (at vLLM's sleep level 2 without its weights): only a sync wakes it
        if engine_stale:
            sync_engine(rollout_engine, policy)
        if start_step == 0 and benchmarks and cfg.eval.before_training:
            metrics = evaluate_benchmarks(ctx, benchmarks, 0, run_dir, "eval_before", logger)
            history["eval_before"] = metrics.get("eval/accuracy")
            # the training clock starts after this evaluation: the before-training point sits at 0 s
            logger.log(0, {**metrics, "time/elapsed_s": 0.0, "tokens/generated_total": 0.0})
        started = time.perf_counter() - history.get("elapsed_s", 0.0)
        step, interrupted = start_step, False
        shapes = step_shapes(cfg)  # what an out-of-memory line names: fixed by the config, built once
        for step in range(start_step + 1, cfg.trainer.max_steps + 1):
            ctx.timings = Timings()
            step_start = time.perf_counter()
            with out_of_memory_reported(cfg, f"step {step}", shapes):
                rollouts = collect_rollouts(ctx, step)
            # every update of this step at lr(step): the schedule counts rollout steps, not mini-batch updates
            lr = set_step_lr(optimizer, step, cfg.trainer)
            rollout_engine.sleep()  # the update gets the memory the engine can release
            # dynamic sampling's keep_partial may leave no group that splits over the ranks: no update this step
            with out_of_memory_reported(cfg, f"step {step}", shapes):
                metrics = train_on_rollouts(ctx, rollouts, ctx.timings) if rollouts.examples else {"lr": lr}
            with ctx.timings("weight_sync"):
                sync_engine(rollout_engine, policy)
            metrics.update(dynamic_sampling_metrics(rollouts))
            step_s = time.perf_counter() - step_start
            completion_tokens = sum(len(r) for r in rollouts.response_ids)
            metrics.update({f"timing/{k}_s": v for k, v in ctx.timings.seconds.items()})
            metrics["timing/step_s"] = step_s
            metrics.update(cuda_memory_metrics(device))
            metrics["throughput/tokens_per_s"] = completion_tokens / step_s
            # the equal-compute axis of tokenpo.compare: every dynamic-sampling round counts, kept or filtered out;
            # the running total lives in the checkpoint's history, so a resumed run continues it
            history["generated_tokens"] = history.get("generated_tokens", 0) + rollouts.generated_tokens
            metrics["tokens/generated"] = float(rollouts.generated_tokens)
            metrics["tokens/generated_total"] = float(history["generated_tokens"])
            last = step == cfg.trainer.max_steps
            evaluated = bool(benchmarks) and (last or bool(cfg.eval.every_steps and step % cfg.eval.every_steps == 0))
            if samples_due(cfg.logger, step) or evaluated:
                logger.log_samples(step, "rollouts", rollout_rows(step, rollouts, ctx.reward, cfg.logger.samples_rows))
            if evaluated:
                eval_metrics = evaluate_benchmarks(ctx, benchmarks, step, run_dir, "eval_after" if last else None,
                                                   logger)
                metrics.update(eval_metrics)
                if last:
                    history["eval_after"] = eval_metrics.get("eval/accuracy")
            metrics["time/elapsed_s"] = time.perf_counter() - started
            logger.log(step, metrics)
            history["elapsed_s"] = metrics["time/elapsed_s"]
            save_due = cfg.trainer.save_every and step % cfg.trainer.save_every == 0
            # every rank must agree: a signal may have reached only some of them
            interrupted = any(dist.all_gather_objects(stop.requested))
            if save_due or interrupted:
                client = {"step": step, "sampler": sampler.state_dict(), "wandb_id": logger.wandb_id,
                          "history": history}
                checkpoint.save(policy, run_dir / "checkpoints", step, client, cfg.trainer.keep_last,
                                cfg.model.lora.settings(), cfg.trainer.verify_checkpoints == "full")
            if interrupted:
                break
        if step == cfg.trainer.max_steps:
            export_hf(policy, tokenizer, run_dir / "final", cfg.deepspeed.stage)
        logger.finish()
    stop.restore()
    summary = {"steps": step, "eval_before": history.get("eval_before"), "eval_after": history.get("eval_after"),
               "elapsed_s": history.get("elapsed_s"), "run_dir": str(run_dir), "interrupted": interrupted,
               "signal": stop.signum if interrupted else None}
    if dist.is_main():
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


def sync_engine(rollout_engine, policy) -> None:
    """After a pass that trained: the blocks torch's caching allocator kept from it handed back to the device (a
    colocated vLLM wakes into its own pool, outside that allocator; TRL and verl empty the cache there too), then
    the engine's weights brought to the policy's, which wakes a sleeping engine (weights, load, KV cache)."""
    torch.cuda.empty_cache()  # does nothing until CUDA is initialised: no-op on CPU
    rollout_engine.sync_weights(policy)


def report_samples(title: str, records: list[dict], count: int) -> None:
    if dist.is_main() and count:
        log.info("sample answers %s:\n%s", title, "\n".join(sample_lines(records, count)))


def write_eval(path: Path, metrics: dict, records: list[dict]) -> None:
    if dist.is_main():
        path.write_text(json.dumps({"metrics": metrics, "records": records}, indent=1))

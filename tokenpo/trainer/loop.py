"""The run: the policy, the generator (rollout engine), the scorer and the data set up, then the loop that calls
`tokenpo.trainer.step.train_step` once per step, with the harness around it: resume and checkpoints
(tokenpo.trainer.state), the worst-case pass and out-of-memory lines (worst_case), held-out evaluation (evals),
metrics and sample tables (tokenpo.logger), stop signals (launch.StopRequest)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import time

import torch

from tokenpo import algorithms as alg
from tokenpo.config import TrainConfig
from tokenpo.data import PromptSampler, describe_template, load_splits
from tokenpo.deepspeed import dist
from tokenpo.evaluation.benchmark import stop_token_ids
from tokenpo.evaluation.run import TextSampler
from tokenpo.logger.run_logger import RunLogger, samples_due
from tokenpo.logger.samples import rollout_rows
from tokenpo.plan.memory import with_vllm_share
from tokenpo.rewards import RewardScorer
from tokenpo.rollout.engine import build_engine
from tokenpo.rollout.ahead import AheadGenerator, WorkerSettings
from tokenpo.rollout.weight_stream import policy_weights
from tokenpo.trainer.ahead import AheadSource, generator_device
from tokenpo.trainer.environment import record_environment
from tokenpo.trainer.evals import AFTER, BEFORE, Evaluator, evaluate_benchmarks, load_benchmarks
from tokenpo.trainer.health import HealthMonitor
from tokenpo.trainer.launch import StopRequest
from tokenpo.trainer.optim import step_lr
from tokenpo.trainer.policy import Policy
from tokenpo.trainer.source import PromptCache, RolloutSource, sampling_params
from tokenpo.trainer.identity import RunIdentity
from tokenpo.trainer.state import RunState, resume_run, save_run
from tokenpo.trainer.step import StepSettings, sync_engine, train_step
from tokenpo.trainer.worst_case import out_of_memory_reported, run_worst_case, step_shapes, worst_case_enabled

log = logging.getLogger("tokenpo")


def train(cfg: TrainConfig, identity: RunIdentity) -> dict:
    """Train `cfg` into `identity.run_dir` (from its checkpoint when trainer.resume finds one); the run's summary."""
    run_dir, trainer = identity.run_dir, cfg.trainer
    if trainer.threads:
        torch.set_num_threads(trainer.threads)
    dist.init_distributed(cfg.deepspeed.backend, trainer.dist_timeout_s)
    cfg.validate_batch(dist.world_size())
    torch.manual_seed(cfg.seed)
    tokenizer, policy = Policy.build(cfg, dist.world_size(), dist.device())
    train_examples, train_eval = load_splits(cfg.data, cfg.seed, tokenizer)
    benchmarks = load_benchmarks(cfg.eval, cfg.data, cfg.seed, tokenizer, train_eval, train_examples)
    sampler = PromptSampler(train_examples, cfg.data.prompts_per_step, cfg.seed)
    prompts, stops = PromptCache(tokenizer, cfg.data), stop_token_ids(tokenizer, cfg.rollout.eos_tokens)
    run = StepSettings.from_config(cfg, tokenizer.pad_token_id)

    def decode(ids: list[list[int]]) -> list[str]:
        return tokenizer.batch_decode(ids, skip_special_tokens=True)

    stop = StopRequest()
    with RewardScorer(run.reward) as scorer, \
            contextlib.closing(build_engine(with_vllm_share(cfg, dist.world_size()), policy.engine, tokenizer,
                                            cfg.deepspeed)) as engine:
        source = RolloutSource(engine, scorer, prompts, decode, sampling_params(cfg.rollout, stops), cfg.seed,
                               policy.device)
        if cfg.rollout.async_.max_staleness:
            source = ahead_source(cfg, source, policy, sampler, tokenizer.pad_token_id)
        evaluator = Evaluator(TextSampler(engine.generate, tokenizer), scorer, cfg.reward, cfg.rollout, cfg.seed)
        state, resumed = resume_run(policy, sampler, trainer.resume, run_dir,
                                    with_checksums=trainer.verify_checkpoints == "full")
        logger = RunLogger(cfg.logger, identity, enabled=dist.is_main(), resume_id=state.wandb_id)
        health = HealthMonitor(trainer.health, policy.guard, state.health, alert=logger.alert)
        logger.describe_run(policy.module)
        if dist.is_main():
            record_environment(run_dir, state.step, dist.world_size())
            log.info("run dir: %s", run_dir)
            log.info("prompt template: %s", describe_template(cfg.data.template, tokenizer))

        def evaluate_at(step: int, point=None) -> dict[str, float]:
            return evaluate_benchmarks(evaluator, benchmarks, step, logger, samples_rows=cfg.logger.samples_rows,
                                       print_samples=trainer.print_samples, run_dir=run_dir, point=point)

        # the engine's weights are the initial policy's until a sync: stale after a resume
        engine_stale = resumed
        if state.step < trainer.max_steps and worst_case_enabled(trainer.worst_case_first, policy.device):
            engine.sleep()  # the pass checks the update's shapes with the memory the update will have
            run_worst_case(cfg, run, policy, [prompts(example) for example in train_examples])
            engine_stale = True  # asleep (at vLLM's sleep level 2 without its weights): only a sync wakes it
        if engine_stale:
            sync_engine(engine, policy)
        if isinstance(source, AheadSource):  # the rounds in flight at the checkpoint, or the first ones
            if state.in_flight is not None:
                source.restore(state.in_flight[dist.rank()])
            source.start(policy, state.step)
        if state.step == 0 and benchmarks and cfg.eval.before_training:
            metrics = evaluate_at(0, BEFORE)
            state.eval_before = metrics.get("eval/accuracy")
            # the training clock starts after this evaluation: the before-training point sits at 0 s
            logger.log(0, {**metrics, "time/elapsed_s": 0.0, "tokens/generated_total": 0.0})

        started = time.perf_counter() - state.elapsed_s
        shapes = step_shapes(cfg)  # what an out-of-memory line names: fixed by the config, built once
        interrupted = False
        for step in range(state.step + 1, trainer.max_steps + 1):
            with out_of_memory_reported(cfg, f"step {step}", shapes):
                result = train_step(step, step_lr(step, trainer), run, policy, source, sampler, state.entropy_coef,
                                    health)
            metrics = result.metrics
            state.step, state.generated_tokens = step, state.generated_tokens + result.generated_tokens
            state.health = health.state_dict()
            state.entropy_coef = result.entropy_coef  # adaptive entropy control goes on from here after a resume
            metrics["tokens/generated_total"] = float(state.generated_tokens)  # a resumed run continues the count
            last = step == trainer.max_steps
            evaluated = bool(benchmarks) and (last or bool(cfg.eval.every_steps and step % cfg.eval.every_steps == 0))
            if samples_due(cfg.logger, step) or evaluated:
                logger.log_samples(step, "rollouts", rollout_rows(step, result.rollouts, result.rewards, run.reward,
                                                                  cfg.logger.samples_rows))
            if evaluated:
                eval_metrics = evaluate_at(step, AFTER if last else None)
                metrics.update(eval_metrics)
                if last:
                    state.eval_after = eval_metrics.get("eval/accuracy")
            metrics["time/elapsed_s"] = state.elapsed_s = time.perf_counter() - started
            logger.log(step, metrics)
            # every rank must agree: a signal may have reached only some of them
            interrupted = any(dist.all_gather_objects(stop.requested))
            # a health detector with action=stop ends the run as a signal does (every rank saw the same metrics)
            interrupted = interrupted or health.stopping is not None
            if (trainer.save_every and step % trainer.save_every == 0) or interrupted:
                if isinstance(source, AheadSource):  # what the generator has sampled ahead, every rank's
                    state.in_flight = dist.all_gather_objects(source.in_flight())
                state.sampler, state.wandb_id = sampler.state_dict(), logger.wandb_id
                save_run(policy, state, run_dir, keep_last=trainer.keep_last,
                         with_checksums=trainer.verify_checkpoints == "full")
            if interrupted:
                break
        if isinstance(source, AheadSource):
            source.close()
        if state.step == trainer.max_steps:
            policy.export(tokenizer, run_dir / "final")
        logger.finish()
    stop.restore()
    summary = write_summary(state, identity, interrupted, stop.signum if interrupted else None, logger.outcome())
    if health.stopping is not None:
        raise health.stop_error(run_dir)
    return summary


def ahead_source(cfg: TrainConfig, source: RolloutSource, policy: Policy, sampler: PromptSampler,
                 pad_id: int) -> AheadSource:
    """`source` with generation ahead of the update in a generator process (rollout.async)."""
    zero3 = cfg.deepspeed.stage == 3
    # the base model: the trainer pushes merged weights under its names (LoRA folded in, as for vLLM)
    base = dataclasses.replace(cfg.model, lora=dataclasses.replace(cfg.model.lora, rank=0))
    settings = WorkerSettings(base, cfg.seed, pad_id, cfg.rollout.async_.generator_threads,
                              cfg.rollout.hf_stop_check_every,
                              generator_device(cfg.rollout.async_.generator_device, dist.world_size()))
    generator = AheadGenerator(settings, policy_weights(policy.module, zero3))
    sampling = cfg.algorithm.dynamic_sampling
    first_round = (alg.prompts_per_round(cfg.data.prompts_per_step, sampling.oversample, dist.world_size())
                   if sampling.enabled else cfg.data.prompts_per_step)
    return AheadSource(source, generator, cfg.rollout.async_.max_staleness, first_round, cfg.trainer.max_steps,
                       sampler, zero3)


def write_summary(state: RunState, identity: RunIdentity, interrupted: bool, signum: int | None,
                  outcome: dict | None = None) -> dict:
    """The run's outcome (rank 0 writes it to summary.json; tokenpo.train and sweeps read it); `outcome`: the
    logger's (algorithm, seed, parameters, the last step's values)."""
    summary = {"steps": state.step, "eval_before": state.eval_before, "eval_after": state.eval_after,
               "elapsed_s": state.elapsed_s, "run_dir": str(identity.run_dir), "interrupted": interrupted,
               "signal": signum, "generated_tokens": state.generated_tokens, **(outcome or {})}
    if dist.is_main():
        (identity.run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary

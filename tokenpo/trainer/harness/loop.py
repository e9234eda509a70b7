"""The run: the policy, the generator (rollout engine), the scorer and the data set up, then the loop that calls
`tokenpo.trainer.core.step.train_step` once per step, with the harness around it: resume and checkpoints
(tokenpo.trainer.harness.state), the worst-case pass and out-of-memory lines (worst_case), held-out evaluation (evals),
metrics and sample tables (tokenpo.logger), stop signals (stop.StopRequest)."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from tokenpo import algorithms as alg
from tokenpo.data import PromptSampler, describe_template, load_splits
from tokenpo.deepspeed import dist
from tokenpo.evaluation.benchmark import stop_token_ids
from tokenpo.evaluation.run import TextSampler
from tokenpo.logger.run_logger import RunLogger, samples_due
from tokenpo.logger.samples import rollout_rows
from tokenpo.plan.memory import with_vllm_share
from tokenpo.rewards import RewardScorer
from tokenpo.rollout import Generator, build_generator
from tokenpo.rollout.engine import started_early
from tokenpo.rollout.generator import GeneratorDown, agreed
from tokenpo.trainer.harness.environment import record_environment
from tokenpo.trainer.harness.evals import AFTER, BEFORE, Evaluator, evaluate_benchmarks, load_benchmarks
from tokenpo.trainer.harness.health import HealthMonitor
from tokenpo.trainer.harness.identity import RunIdentity
from tokenpo.trainer.harness.stop import StopRequest
from tokenpo.trainer.core.optim import step_lr
from tokenpo.trainer.core.policy import Policy
from tokenpo.trainer.core.source import PromptCache, Prompts, RolloutSource, Schedule, sampling_params
from tokenpo.trainer.harness.state import RunState, resume_run, save_run
from tokenpo.trainer.core.step import StepResult, StepSettings, train_step
from tokenpo.trainer.core.worst_case import out_of_memory_reported, run_worst_case, step_shapes, worst_case_enabled

if TYPE_CHECKING:
    from tokenpo.config import TrainConfig

log = logging.getLogger("tokenpo")


def train(cfg: TrainConfig, identity: RunIdentity) -> dict:
    """Train `cfg` into `identity.run_dir` (from its checkpoint when trainer.resume finds one); the run's summary."""
    run_dir, trainer = identity.run_dir, cfg.trainer
    if trainer.threads:
        torch.set_num_threads(trainer.threads)
    dist.init_distributed(cfg.deepspeed.backend, trainer.dist_timeout_s)
    world = dist.world_size()
    cfg.validate_batch(world)
    torch.manual_seed(cfg.seed)
    # a server engine's servers boot while the model loads
    with started_early(cfg.rollout, cfg.model) as early:
        tokenizer, policy = Policy.build(cfg, world, dist.device())
        train_examples, train_eval = load_splits(cfg.data, cfg.seed, tokenizer)
        benchmarks = load_benchmarks(cfg.eval, cfg.data, cfg.seed, tokenizer, train_eval, train_examples)
        sampler = PromptSampler(train_examples, cfg.data.prompts_per_step, cfg.seed)
        run = StepSettings.from_config(cfg, tokenizer.pad_token_id)
        with StopRequest() as stop, RewardScorer(run.reward) as scorer, \
                contextlib.closing(build_generator(with_vllm_share(cfg, world), tokenizer, policy.publish(0),
                                                   policy.device, world, early)) as generator:
            source = rollout_source(cfg, generator, scorer, sampler, tokenizer)
            # every rank makes the same sample calls: a generator down on one is down on all (agreed)
            evaluator = Evaluator(TextSampler(functools.partial(agreed, generator.sample), tokenizer), scorer,
                                  cfg.reward, cfg.rollout, cfg.seed)
            state, _ = resume_run(policy, sampler, trainer.resume, run_dir,
                                  with_checksums=trainer.verify_checkpoints == "full")
            logger = RunLogger(cfg.logger, identity, enabled=dist.is_main(), resume_id=state.wandb_id)
            health = HealthMonitor(trainer.health, state.health, alert=logger.alert)
            announce(cfg, identity, state, policy, logger, tokenizer)
            evaluate = functools.partial(evaluate_benchmarks, evaluator, benchmarks, logger=logger, run_dir=run_dir,
                                         samples_rows=cfg.logger.samples_rows, print_samples=trainer.print_samples)
            loop = Loop(cfg, run_dir, run, policy, source, logger, health, state, evaluate if benchmarks else None)
            if state.step < trainer.max_steps and worst_case_enabled(trainer.worst_case_first, policy.device):
                source.before_update()  # the pass checks the update's shapes with the memory the update will have
                run_worst_case(cfg, run, policy, [source.prompts.encode(example) for example in train_examples])
            if state.in_flight is not None:  # the rounds in flight at the checkpoint, this rank's
                source.load_state_dict(state.in_flight[dist.rank()])
            source.start(policy, state.step)
            interrupted = loop.train_steps(stop)
            if state.step == trainer.max_steps:
                policy.export(tokenizer, run_dir / "final")
            logger.finish()
    summary = write_summary(state, identity, interrupted, stop.signum if interrupted else None, logger.outcome())
    if health.stopping is not None:
        raise health.stop_error(run_dir)
    return summary


def rollout_source(cfg: TrainConfig, generator: Generator, scorer: RewardScorer, sampler: PromptSampler,
                   tokenizer) -> RolloutSource:
    """The run's source of scored rollouts over `generator`, on the schedule rollout.async sets."""
    sampling = cfg.algorithm.dynamic_sampling
    first_round = (alg.prompts_per_round(cfg.data.prompts_per_step, sampling.oversample, dist.world_size())
                   if sampling.enabled else cfg.data.prompts_per_step)
    prompts = Prompts(sampler, PromptCache(tokenizer, cfg.data),
                      functools.partial(tokenizer.batch_decode, skip_special_tokens=True))
    stops = stop_token_ids(tokenizer, cfg.rollout.eos_tokens)
    return RolloutSource(generator, scorer, prompts, sampling_params(cfg.rollout, stops),
                         Schedule(cfg.rollout.async_.max_staleness, first_round, cfg.trainer.max_steps), cfg.seed)


def announce(cfg: TrainConfig, identity: RunIdentity, state: RunState, policy: Policy, logger: RunLogger,
             tokenizer) -> None:
    """The run described to the logger, and on rank 0 its environment recorded and its folder and template logged."""
    logger.describe_run(policy.module)
    if dist.is_main():
        record_environment(identity.run_dir, state.step, dist.world_size())
        log.info("run dir: %s", identity.run_dir)
        log.info("prompt template: %s", describe_template(cfg.data.template, tokenizer))


@dataclasses.dataclass
class Loop:
    """The steps and what happens around each: evaluations, sample tables, metrics, checkpoints, stops."""

    cfg: TrainConfig
    run_dir: Path
    run: StepSettings
    policy: Policy
    source: RolloutSource
    logger: RunLogger
    health: HealthMonitor
    state: RunState
    # evaluate(step, point=None) -> metrics: every benchmark at a step (evals.evaluate_benchmarks); None without any
    evaluate: Callable[..., dict[str, float]] | None

    def train_steps(self, stop: StopRequest) -> bool:
        """The evaluation before training, then the steps from the state's on; whether a stop ended them early."""
        state, trainer = self.state, self.cfg.trainer
        if state.step == 0 and self.evaluate and self.cfg.eval.before_training:
            metrics = self.evaluate(0, point=BEFORE)
            state.eval_before = metrics.get("eval/accuracy")
            # the training clock starts after this evaluation: the before-training point sits at 0 s
            self.logger.log(0, {**metrics, "time/elapsed_s": 0.0, "tokens/generated_total": 0.0})
        started = time.perf_counter() - state.elapsed_s
        shapes = step_shapes(self.cfg)  # what an out-of-memory line names: fixed by the config, built once
        for step in range(state.step + 1, trainer.max_steps + 1):
            with out_of_memory_reported(self.cfg, f"step {step}", shapes), self.saved_when_generator_down():
                result = train_step(step, step_lr(step, trainer), self.run, self.policy, self.source,
                                    state.entropy_coef, self.health)
            with self.saved_when_generator_down():  # its evaluation: the checkpoint holds the step
                metrics = self.after_step(step, result)
            metrics["time/elapsed_s"] = state.elapsed_s = time.perf_counter() - started
            self.logger.log(step, metrics)
            if self.source.down is not None:  # the step's update is applied and logged; its weights did not leave
                self.save()
                raise self.saved(self.source.down)
            # every rank must agree: a signal may have reached only some of them; a health detector with
            # action=stop ends the run as a signal does (every rank saw the same metrics)
            interrupted = any(dist.all_gather_objects(stop.requested)) or self.health.stopping is not None
            if (trainer.save_every and step % trainer.save_every == 0) or interrupted:
                self.save()
            if interrupted:
                return True
        return False

    @contextlib.contextmanager
    def saved_when_generator_down(self):
        """A generator that died before the step's update (its process or servers): the run as of the step before
        is saved, the rounds the generator lost left to sample again, and the error goes on (one line). In the
        evaluation after the update: the run as of the step is saved (its metrics row is not written)."""
        try:
            yield
        except GeneratorDown as error:
            self.save()
            raise self.saved(error) from None

    def saved(self, error: GeneratorDown) -> GeneratorDown:
        return GeneratorDown(f"{error} (the run saved its checkpoint at step {self.state.step}: the same command "
                             f"resumes it)")

    def after_step(self, step: int, result: StepResult) -> dict[str, float]:
        """The run state advanced past `step`; its metrics with the evaluation due at it; its sample table."""
        state, metrics, last = self.state, result.metrics, step == self.cfg.trainer.max_steps
        state.step, state.generated_tokens = step, state.generated_tokens + result.generated_tokens
        state.health = self.health.state_dict()
        state.entropy_coef = result.entropy_coef  # adaptive entropy control goes on from here after a resume
        metrics["tokens/generated_total"] = float(state.generated_tokens)  # a resumed run continues the count
        every = self.cfg.eval.every_steps
        evaluated = self.evaluate is not None and (last or bool(every and step % every == 0))
        if samples_due(self.cfg.logger, step) or evaluated:
            self.logger.log_samples(step, "rollouts", rollout_rows(step, result.rollouts, result.rewards,
                                                                   self.run.reward, self.cfg.logger.samples_rows))
        if evaluated:
            eval_metrics = self.evaluate(step, point=AFTER if last else None)
            metrics.update(eval_metrics)
            if last:
                state.eval_after = eval_metrics.get("eval/accuracy")
        return metrics

    def save(self) -> None:
        """A checkpoint of the policy and the run state, with every rank's rounds in flight."""
        state, trainer = self.state, self.cfg.trainer
        state.in_flight = dist.all_gather_objects(self.source.state_dict())
        state.sampler, state.wandb_id = self.source.prompts.sampler.state_dict(), self.logger.wandb_id
        save_run(self.policy, state, self.run_dir, keep_last=trainer.keep_last,
                 with_checksums=trainer.verify_checkpoints == "full")


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

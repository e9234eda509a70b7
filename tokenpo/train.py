"""`python -m tokenpo.train` / `tokenpo-train`: a Hydra-composed RL fine-tuning run.

    python -m tokenpo.train                                   # the embedded default (GRPO, SmolLM2-135M, arith)
    python -m tokenpo.train algorithm=dapo rollout.group_size=8
    python -m tokenpo.train -m algorithm=grpo,dapo,gtpo seed=0,1,2
"""

from __future__ import annotations

import logging
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from tokenpo import CONF_DIR
from tokenpo.cli_help import explain, explain_request, normalize_hydra_flags, short_help
from tokenpo.config import GROUPS, build_config
from tokenpo.errors import ConfigError
from tokenpo.models.config import lora_lr_note
from tokenpo.plan.context import check_run_context, check_token_budget, resolved_max_model_len, run_prompt_lengths
from tokenpo.plan.memory import check_memory_plan
from tokenpo.preflight import check_command_line, check_inputs
from tokenpo.rollout.generator import GeneratorDown
from tokenpo.schema import config_dict
from tokenpo.trainer import rundir
from tokenpo.trainer import RunIdentity
from tokenpo.versions import check_supported_versions

log = logging.getLogger("tokenpo")


# overrides that say how a job runs, not what it computes: left out of run names
RUN_CONTROL_KEYS = ("logger.mode", "trainer.nproc", "trainer.resume", "hydra.")


def is_run_control(override: str) -> bool:
    return override.lstrip("+~").startswith(RUN_CONTROL_KEYS)


def run_identity(tree: DictConfig) -> RunIdentity:
    """Run dir, W&B run name (the job's overrides), group (the sweep folder, or 'single') and resolved config."""
    hc = HydraConfig.get()
    overrides = [o for o in hc.overrides.task if not is_run_control(o)]
    name = ",".join(sorted(overrides)) or "default"
    group = Path(hc.sweep.dir).name if hc.mode.name == "MULTIRUN" else "single"
    return RunIdentity(Path(hc.runtime.output_dir), name, group, OmegaConf.to_container(tree, resolve=True))


class JobFailed(RuntimeError):
    """A sweep's job failed: its launcher records the failure and the sweep goes on (Optuna marks the trial failed)."""


def fail(message: str, in_sweep: bool = False) -> None:
    print(f"tokenpo: error: {message}", file=sys.stderr)
    if in_sweep:
        raise JobFailed(message)
    sys.exit(2)


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="train")
def hydra_main(tree: DictConfig) -> float | None:
    """One job: a single run, or one point of a sweep; returns trainer.objective at the last step (sweepers read it)."""
    from tokenpo.trainer import Requeued

    in_sweep = HydraConfig.get().mode == RunMode.MULTIRUN
    try:
        return run_job(tree, in_sweep)
    except ConfigError as err:
        fail(str(err), in_sweep)
    except GeneratorDown as err:
        fail(str(err), in_sweep)
    except Requeued:  # the job's rerun resumes: not a failed job of the sweep
        raise
    except SystemExit as exit_:
        # a failed worker of a trainer.nproc job fails this job only; a clean stop (a signal) stops the sweep too
        if in_sweep and exit_.code:
            raise JobFailed(f"job {HydraConfig.get().job.num} exited with status {exit_.code}") from None
        raise


def job_world(nproc: int) -> int:
    """The job's process count under an external launcher or a submitit job of several tasks (1 otherwise)."""
    from tokenpo.trainer import adopt_submitit_environment, external_world_size, local_world_size

    if adopt_submitit_environment():
        if nproc != local_world_size():
            raise ConfigError(f"trainer.nproc={nproc} but this submitit job runs {local_world_size()} tasks per node: "
                              "set hydra.launcher.tasks_per_node to trainer.nproc (conf/hydra/launcher/slurm.yaml does)")
    elif external_world_size() > 1 and nproc > 1:
        raise ConfigError(f"trainer.nproc={nproc} starts local workers itself; under an external launcher "
                          f"(WORLD_SIZE={external_world_size()}) leave trainer.nproc at 1")
    return external_world_size()


def run_job(tree: DictConfig, in_sweep: bool) -> float | None:
    from tokenpo.deepspeed.build_locks import check_build_locks
    from tokenpo.trainer import sweep
    from tokenpo.trainer import hand_over_stop, launch_local_workers

    cfg = build_config(tree)
    sweep.restore_start_method()
    if in_sweep and not cfg.trainer.threads:
        # jobs side by side (joblib, submitit's cpus_per_task) share the cores instead of each taking all of them
        tree.trainer.threads = cfg.trainer.threads = sweep.job_threads(HydraConfig.get().launcher, cfg.trainer.nproc)
    world = job_world(cfg.trainer.nproc)
    # before any process starts or loads a model
    cfg.validate_batch(max(world, cfg.trainer.nproc))
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    job = HydraConfig.get().job.num if in_sweep else None
    # a submitit job's other tasks share this run dir: rank 0 alone reports and writes
    rank0 = int(os.environ.get("RANK", "0")) == 0
    resume = cfg.trainer.resume
    if in_sweep and resume != "none":
        same = sweep.same_job(run_dir, HydraConfig.get().overrides.task, is_run_control)
        if same and sweep.finished_summary(run_dir, cfg.trainer.max_steps):
            if rank0:
                log.info("job %d: skipped: finished (results untouched in %s)", job, run_dir)
            return sweep.objective_value(run_dir, cfg.trainer.objective)
        if same is False:  # another sweep's run: set aside, never resumed
            resume = "none"
    check_inputs(cfg, run_dir)
    inert = cfg.inert_components()
    if inert and rank0:
        log.info(inert)
    if cfg.trainer.nproc > 1 and world == 1:
        # after the checks that need no torch: counting CUDA devices imports it
        from tokenpo.deepspeed.dist import visible_cuda_devices
        from tokenpo.trainer import check_local_devices

        check_local_devices(cfg.trainer.nproc, visible_cuda_devices())
    # the data and tokenizer (seconds, no weights): the real prompt lengths for the context check and the memory plan
    prompts = run_prompt_lengths(cfg)
    check_token_budget(cfg, prompts)
    max_model_len = resolved_max_model_len(cfg.rollout, check_run_context(cfg, prompts))
    if max_model_len != cfg.rollout.vllm.max_model_len:  # vLLM's, null: workers read the tree
        tree.rollout.vllm.max_model_len = cfg.rollout.vllm.max_model_len = max_model_len
    check_memory_plan(cfg, max(world, cfg.trainer.nproc), prompts.train)
    if rank0:
        note = lora_lr_note(HydraConfig.get().runtime.choices.get("experiment"), cfg.model.lora.rank,
                            cfg.trainer.lr, any(o.lstrip("+").startswith("trainer.lr=")
                                                for o in HydraConfig.get().overrides.task))
        if note:
            log.warning(note)
        if in_sweep:
            log.info("job %d: %s in %s", job, "resumed" if rundir.continues_here(run_dir, resume) else "started",
                     run_dir)
        start_run_dir(run_dir, resume, tree)
    identity = run_identity(tree)
    # before DeepSpeed JIT-builds anything here or in the workers: a lock left by a killed build hangs it silently
    check_build_locks(os.environ)
    if cfg.trainer.nproc > 1 and world == 1:
        summary = launch_local_workers(cfg.trainer.nproc, identity)
    else:
        summary = run_here(cfg, identity, world)
    if summary is None:
        return None
    if summary.get("interrupted"):
        # quoted for Hydra: run dirs hold '=' and ',' (the overrides)
        key, folder = ("hydra.sweep.dir", HydraConfig.get().sweep.dir) if in_sweep else ("hydra.run.dir", run_dir)
        log.warning("stopped by a signal after step %d; checkpoint saved under %s/checkpoints; to continue, run the "
                    "same command with \"%s='%s'\"", summary["steps"], run_dir, key, folder)
        hand_over_stop(summary.get("signal"), rank0)
        # a sweep stops here too
        sys.exit(0)
    before, after = summary["eval_before"], summary["eval_after"]
    if before is not None and after is not None:
        log.info("held-out accuracy: %.1f%% before -> %.1f%% after (%d steps, %.0f s); run dir: %s",
                 100 * before, 100 * after, summary["steps"], summary["elapsed_s"] or 0, run_dir)
    return sweep.objective_value(run_dir, cfg.trainer.objective)


def start_run_dir(run_dir: Path, resume: str, tree: DictConfig) -> None:
    """Before the run writes anything: an earlier run in `run_dir` that this start does not resume is set aside,
    then this start's Hydra files are written (conf/train.yaml keeps Hydra from writing them over the earlier run's):
    `.hydra/` for a new run; `.hydra/resume-<time>/` for a resume, whose `.hydra/` keeps the run's first start."""
    if not rundir.continues_here(run_dir, resume):
        rundir.set_aside_earlier_run(run_dir)
    hydra_dir = run_dir / ".hydra"
    if hydra_dir.exists():
        hydra_dir = hydra_dir / f"resume-{time.strftime('%Y%m%d-%H%M%S')}"
    hydra_dir.mkdir(parents=True, exist_ok=True)
    hydra = HydraConfig.instance().cfg
    for name, node in (("config.yaml", tree), ("hydra.yaml", hydra), ("overrides.yaml", hydra.hydra.overrides.task)):
        (hydra_dir / name).write_text(OmegaConf.to_yaml(node))


def run_here(cfg, identity: RunIdentity, world: int) -> dict:
    """Train in this process; under an external launcher every rank takes rank 0's run dir and names."""
    from tokenpo.deepspeed import dist
    from tokenpo.trainer import train

    if world > 1:
        dist.init_distributed(cfg.deepspeed.backend, cfg.trainer.dist_timeout_s)
        run_dir, name, group = dist.broadcast_object((identity.run_dir, identity.name, identity.group))
        identity = replace(identity, run_dir=run_dir, name=name, group=group)
        if not dist.is_main():
            logging.getLogger().setLevel(logging.WARNING)
    return train(cfg, identity)


def main() -> None:
    from tokenpo.progress import quiet_library_bars
    from tokenpo.trainer import adopt_slurm_environment, external_launcher_argv

    quiet_library_bars()
    try:
        # before the command line is read: a task of srun with several tasks is one rank of one run
        adopt_slurm_environment()
        sys.argv[1:] = external_launcher_argv(sys.argv[1:])
        if answer_help(sys.argv[1:]):
            return
        sys.argv[1:] = normalize_hydra_flags(sys.argv[1:])
        # a DeepSpeed or PEFT release outside the tested range trains wrong or fails late: refused before any work
        check_supported_versions()
        check_command_line(CONF_DIR, "train", sys.argv[1:])
    except ConfigError as err:
        fail(str(err))
    hydra_main()


def answer_help(argv: list[str]) -> bool:
    """`--help` (short, with pointers) or `--explain KEY [overrides]` printed; whether one was asked for."""
    if {"-h", "--help"} & set(argv):
        print(short_help(CONF_DIR))
        return True
    request = explain_request(argv)
    if request is None:
        return False
    from tokenpo.plan.cli import compose_train_config

    key, overrides = request
    cfg = compose_train_config(overrides)
    values = {"seed": cfg.seed, **{group: config_dict(getattr(cfg, group)) for group in GROUPS}}
    print(explain(key, values, overrides, CONF_DIR))
    return True


if __name__ == "__main__":
    main()

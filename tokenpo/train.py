"""`python -m tokenpo.train` / `tokenpo-train`: a Hydra-composed RL fine-tuning run.

    python -m tokenpo.train                                   # the embedded default (GRPO, SmolLM2-135M, arith)
    python -m tokenpo.train algorithm=dapo rollout.group_size=8
    python -m tokenpo.train -m algorithm=grpo,dapo,gtpo seed=0,1,2
"""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from tokenpo import CONF_DIR
from tokenpo.config import build_config
from tokenpo.errors import ConfigError
from tokenpo.plan.memory import check_memory_plan
from tokenpo.preflight import check_command_line, check_inputs
from tokenpo.trainer import rundir

log = logging.getLogger("tokenpo")


# overrides that say how a job runs, not what it computes: left out of run names
RUN_CONTROL_KEYS = ("logger.mode", "trainer.nproc", "trainer.resume", "hydra.")


def run_identity() -> tuple[Path, str, str]:
    """Run dir, W&B run name (the job's overrides) and group (the sweep folder, or 'single')."""
    hc = HydraConfig.get()
    run_dir = Path(hc.runtime.output_dir)
    overrides = [o for o in hc.overrides.task if not o.lstrip("+~").startswith(RUN_CONTROL_KEYS)]
    name = ",".join(sorted(overrides)) or "default"
    group = Path(hc.sweep.dir).name if hc.mode.name == "MULTIRUN" else "single"
    return run_dir, name, group


def fail(message: str) -> None:
    print(f"tokenpo: error: {message}", file=sys.stderr)
    sys.exit(2)


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="train")
def hydra_main(tree: DictConfig) -> float | None:
    from tokenpo.trainer.launch import external_world_size, launch_local_workers

    try:
        cfg = build_config(tree)
        world = external_world_size()
        if world > 1 and cfg.trainer.nproc > 1:
            raise ConfigError(f"trainer.nproc={cfg.trainer.nproc} starts local workers itself; under an external "
                              f"launcher (WORLD_SIZE={world}) leave trainer.nproc at 1")
        # before any process starts or loads a model
        cfg.validate_batch(max(world, cfg.trainer.nproc))
        check_memory_plan(cfg, max(world, cfg.trainer.nproc))
        run_dir, name, group = run_identity()
        check_inputs(cfg, run_dir)
    except ConfigError as err:
        fail(str(err))
    start_run_dir(run_dir, cfg.trainer.resume, tree)
    resolved = OmegaConf.to_container(tree, resolve=True)
    if cfg.trainer.nproc > 1:
        summary = launch_local_workers(cfg.trainer.nproc, run_dir, name, group, resolved)
    else:
        summary = run_here(cfg, run_dir, name, group, resolved, world)
    if summary is None:
        return None
    if summary.get("interrupted"):
        # quoted for Hydra: run dirs hold '=' and ',' (the overrides)
        log.warning("stopped by a signal after step %d; checkpoint saved under %s/checkpoints; to continue, run the "
                    "same command with \"hydra.run.dir='%s'\"", summary["steps"], run_dir, run_dir)
        # a sweep stops here too
        sys.exit(0)
    before, after = summary["eval_before"], summary["eval_after"]
    if before is not None and after is not None:
        log.info("held-out accuracy: %.1f%% before -> %.1f%% after (%d steps, %.0f s); run dir: %s",
                 100 * before, 100 * after, summary["steps"], summary["elapsed_s"] or 0, run_dir)
    return after


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


def run_here(cfg, run_dir: Path, name: str, group: str, resolved: dict, world: int) -> dict:
    """Train in this process; under an external launcher every rank takes rank 0's run dir and names."""
    from tokenpo.deepspeed import dist
    from tokenpo.trainer.loop import train

    if world > 1:
        dist.init_distributed(cfg.deepspeed.backend)
        run_dir, name, group = dist.broadcast_object((run_dir, name, group))
        if not dist.is_main():
            logging.getLogger().setLevel(logging.WARNING)
    try:
        return train(cfg, run_dir, name, group, resolved)
    except ConfigError as err:
        fail(str(err))


def main() -> None:
    from tokenpo.trainer.launch import external_launcher_argv

    sys.argv[1:] = external_launcher_argv(sys.argv[1:])
    try:
        check_command_line(CONF_DIR, "train", sys.argv[1:])
    except ConfigError as err:
        fail(str(err))
    hydra_main()


if __name__ == "__main__":
    main()

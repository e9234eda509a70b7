"""`python -m tokenpo.train` / `tokenpo-train`: a Hydra-composed RL fine-tuning run.

    python -m tokenpo.train                                   # the embedded default (GRPO, SmolLM2-135M, arith)
    python -m tokenpo.train algorithm=dapo rollout.group_size=8
    python -m tokenpo.train -m algorithm=grpo,dapo,gtpo seed=0,1,2
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from tokenpo.config import build_config
from tokenpo.errors import ConfigError

CONF_DIR = str(Path(__file__).resolve().parent.parent / "conf")
log = logging.getLogger("tokenpo")


def run_identity() -> tuple[Path, str, str]:
    """Run dir, W&B run name (the overrides) and group (the sweep folder, or 'single')."""
    hc = HydraConfig.get()
    run_dir = Path(hc.runtime.output_dir)
    name = hc.job.override_dirname or "default"
    group = Path(hc.sweep.dir).name if hc.mode.name == "MULTIRUN" else "single"
    return run_dir, name, group


def fail(message: str) -> None:
    print(f"tokenpo: error: {message}", file=sys.stderr)
    sys.exit(2)


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="train")
def hydra_main(tree: DictConfig) -> float | None:
    try:
        cfg = build_config(tree)
    except ConfigError as err:
        fail(str(err))
    run_dir, name, group = run_identity()
    resolved = OmegaConf.to_container(tree, resolve=True)
    if cfg.trainer.nproc > 1 and "WORLD_SIZE" not in os.environ:
        from tokenpo.trainer.launch import launch_local_workers

        return launch_local_workers(cfg.trainer.nproc, run_dir, name, group, resolved)
    from tokenpo.trainer.loop import train

    try:
        summary = train(cfg, run_dir, name, group, resolved)
    except ConfigError as err:
        fail(str(err))
    before, after = summary["eval_before"], summary["eval_after"]
    if before is not None and after is not None:
        log.info("held-out accuracy: %.1f%% before -> %.1f%% after (%d steps, %.0f s); run dir: %s",
                 100 * before, 100 * after, summary["steps"], summary["elapsed_s"] or 0, run_dir)
    return after


def main() -> None:
    hydra_main()


if __name__ == "__main__":
    main()

"""Configs as `python -m tokenpo.train` / `tokenpo.evaluate` compose them, and the small run the tests train."""

from __future__ import annotations

import copy
import functools
from collections.abc import Sequence
from pathlib import Path

from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, OmegaConf

from tokenpo import CONF_DIR
from tokenpo.config import TrainConfig, build_config

# a tiny model, a tiny batch (4 prompts x 2 responses of 8 tokens, 4 held-out problems), one intra-op thread per
# process (two ranks share two cores), no W&B; a reward with signal for a random model (tests/trainer/trainer_rewards)
SMALL = ["model=tiny", "logger.mode=disabled", "data.prompts_per_step=4", "rollout.group_size=2",
         "rollout.max_new_tokens=8", "eval.max_problems=4", "trainer.threads=1", "trainer.print_samples=0",
         "reward.fn=trainer_rewards:even_length", "reward.num_workers=1"]

ALGORITHM_CONF = Path(CONF_DIR) / "algorithm"
# every shipped config, read from the folder: a new conf/algorithm/<name>.yaml is tested without editing a list
ALGORITHM_NAMES = tuple(sorted(path.stem for path in ALGORITHM_CONF.glob("*.yaml")))


def compose_tree(config: str, overrides: Sequence[str] = (), return_hydra_config: bool = False) -> DictConfig:
    """The tree Hydra composes from conf/<config>.yaml with `overrides` (unresolved, unvalidated)."""
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose(config, overrides=list(overrides), return_hydra_config=return_hydra_config)


def train_config(*overrides: str) -> TrainConfig:
    """The validated config of `python -m tokenpo.train <overrides>`."""
    return build_config(compose_tree("train", overrides))


def compose_config(overrides: list[str]) -> tuple[TrainConfig, dict]:
    """(TrainConfig, resolved dict) for `python -m tokenpo.train <overrides>`."""
    tree = compose_tree("train", overrides)
    return build_config(tree), OmegaConf.to_container(tree, resolve=True)


def compose_evaluate(overrides: list[str]) -> DictConfig:
    """The tree of `python -m tokenpo.evaluate <overrides>`."""
    import tokenpo.evaluate  # noqa: F401 (registers the `evaluate` config; imports torch, so only here)

    return compose_tree("evaluate", overrides)


@functools.lru_cache(maxsize=None)
def composed_algorithm(name: str) -> dict:
    return OmegaConf.to_container(compose_tree(f"algorithm/{name}").algorithm, resolve=True)


def algorithm_dict(name: str) -> dict:
    """conf/algorithm/<name>.yaml with its base's values, as Hydra composes it (a fresh copy: callers may edit it)."""
    return copy.deepcopy(composed_algorithm(name))

"""The config tree's OmegaConf resolvers, and the run-dir name conf/train.yaml builds with them."""

from __future__ import annotations

import re

import pytest
from hydra.core.hydra_config import HydraConfig

from support.config import compose_tree
from tokenpo.resolvers import join_nonempty

TIME = r"\d{4}-\d\d-\d\d_\d\d-\d\d-\d\d"


def test_join_nonempty_skips_empty_parts():
    assert join_nonempty("_", "2026-01-02", "") == "2026-01-02"
    assert join_nonempty("_", "2026-01-02", "seed=1") == "2026-01-02_seed=1"
    assert join_nonempty("_", "", "") == ""


def run_dir(*overrides: str) -> str:
    tree = compose_tree("train", overrides, return_hydra_config=True)
    HydraConfig.instance().set_config(tree)  # what Hydra's main does before it resolves the run dir
    return tree.hydra.run.dir


@pytest.mark.parametrize("overrides, suffix", [
    ((), ""),
    # logger.mode only says how the job runs: excluded from the name (conf/train.yaml), so no "_" either
    (("logger.mode=disabled",), ""),
    (("seed=1", "algorithm=dapo"), "_algorithm=dapo,seed=1"),
])
def test_run_dir_ends_in_an_underscore_only_before_overrides(overrides, suffix):
    assert re.fullmatch(rf"outputs/runs/{TIME}{re.escape(suffix)}", run_dir(*overrides))

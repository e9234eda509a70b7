"""Command-line checks before Hydra's main: every option and key a (sweep) command line names is composed once."""

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser

from tokenpo import CONF_DIR
from tokenpo.errors import ConfigError
from tokenpo.preflight import check_command_line, job_overrides


def check(*argv: str) -> None:
    check_command_line(CONF_DIR, "train", list(argv))


def test_a_sweep_is_composed_once_per_swept_value_not_as_the_product():
    overrides = OverridesParser.create().parse_overrides(["algorithm=grpo,dapo", "seed=range(0,3)", "model=tiny"])
    assert job_overrides(overrides) == [
        ["algorithm=grpo", "seed=0", "model=tiny"],
        ["algorithm=dapo", "seed=0", "model=tiny"],
        ["algorithm=grpo", "seed=1", "model=tiny"],
        ["algorithm=grpo", "seed=2", "model=tiny"],
    ]


def test_good_command_lines_pass():
    check()
    check("-m", "algorithm=grpo,dapo", "seed=0,1", "model=tiny")
    # the experiment sets hydra.mode: MULTIRUN, so its sweep needs no -m
    check("experiment=hparams_search/grpo_lr_group_size", "seed=0,1")


def test_unknown_experiment_is_an_error_though_the_group_is_optional():
    # Hydra skips a missing option of an optional group without a word: the run would be a plain default run
    with pytest.raises(ConfigError, match=r"^experiment=dapo_ladder/9_nope: no such option in config group "
                                          r"'experiment' \(available: dapo_ladder/0_naive_grpo, "):
        check("experiment=dapo_ladder/9_nope")


def test_sweep_without_multirun_asks_for_m():
    with pytest.raises(ConfigError, match=r"^seed=0,1 sweeps over several values: add -m"):
        check("seed=0,1")


def test_bad_value_in_a_later_sweep_job_fails_before_the_first_job():
    with pytest.raises(ConfigError, match="^rollout.group_size must be >= 1, got -2$"):
        check("-m", "rollout.group_size=4,-2")


def test_override_syntax_error_names_the_override():
    with pytest.raises(ConfigError, match=r"^trainer.lr=\[1,: "):
        check("trainer.lr=[1,")


def test_hydra_commands_and_other_config_trees_are_left_to_hydra():
    check("--help", "algorithm=grpoo")
    check("--config-name", "other", "algorithm=grpoo")

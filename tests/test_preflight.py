"""Command-line checks before Hydra's main: every option and key a (sweep) command line names is composed once."""

import re

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


def compose_config(*overrides: str):
    from hydra import compose, initialize_config_dir

    from tokenpo.config import build_config

    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return build_config(compose("train", ["model=tiny", *overrides]))


EXTRA_GSM8K = "+eval.extra=[{name: gsm8k, data: ${eval.data}}]"


@pytest.mark.parametrize("overrides, key", [
    (["eval=gsm8k", "eval.data.path=/nonexistent/gsm8k.jsonl"], "eval.data.path"),
    (["eval=gsm8k", "eval.data.path=/nonexistent/gsm8k.jsonl", "eval.name=main", EXTRA_GSM8K], "eval.data.path"),
])
def test_a_missing_benchmark_file_names_the_key_that_set_it(tmp_path, overrides, key):
    from tokenpo.preflight import check_inputs

    with pytest.raises(ConfigError, match=rf"^{re.escape(key)} /nonexistent/gsm8k.jsonl does not exist$"):
        check_inputs(compose_config(*overrides), tmp_path)


def test_an_extra_benchmarks_data_errors_name_its_entry(tmp_path):
    from tokenpo.preflight import check_inputs

    good = tmp_path / "good.jsonl"
    good.write_text('{"question": "1+1?", "answer": "#### 2"}\n')
    extra = ("+eval.extra=[{name: other, data: {name: other, loader: gsm8k, path: /nonexistent/other.jsonl, "
             "train_split: null, eval_split: test}}]")
    cfg = compose_config("eval=gsm8k", f"eval.data.path={good}", extra)
    with pytest.raises(ConfigError, match=r"^eval\.extra\[0\]\.data\.path /nonexistent/other.jsonl does not exist$"):
        check_inputs(cfg, tmp_path)
    bad_value = ("+eval.extra=[{name: other, data: {name: other, loader: gsm8k, path: null, hub_id: null, "
                 "train_split: null, eval_split: test, max_eval_examples: 0}}]")
    with pytest.raises(ConfigError, match=r"^eval\.extra\[0\]\.data\.max_eval_examples must be an integer >= 1"):
        compose_config("eval=gsm8k", f"eval.data.path={good}", bad_value)

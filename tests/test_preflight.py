"""Command-line checks before Hydra's main: every option and key a (sweep) command line names is composed once."""

import re

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser

from support.config import train_config
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
                                          r"'experiment' \(available: .*dapo_ladder/0_naive_grpo, dapo_ladder/1_"):
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
    return train_config("model=tiny", *overrides)


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


# Broken data files as a new user makes them (issue 28): name -> (file name, text, the one line that refuses it)
GOOD_ROW = '{"problem": "1+1?", "answer": "2"}\n'
BROKEN_DATA = {
    "empty": ("train.jsonl", "", "data.path {path} is empty (0 bytes)"),
    "blank lines only": ("train.jsonl", "\n\n", "data.path {path} holds no rows"),
    "CSV header only": ("train.csv", "problem,answer\n", "data.path {path} holds no rows"),
    "malformed line": ("train.jsonl", GOOD_ROW + '{"problem": "2+2?", \n',
                       "data.path {path} line 2 is not valid JSON: Expecting property name enclosed in double quotes "
                       "(column 21)"),
    "malformed JSON list": ("train.json", '[{"problem": "1+1?", "answer": "2"},]',
                            "data.path {path} is not valid JSON: Expecting value (line 1, column 37)"),
    "CSV without the answer column": ("train.csv", "problem,solution\n1+1?,2\n",
                                      "data.answer_key 'answer' not found in {path} (fields: problem, solution)"),
    "CSV without the problem column": ("train.csv", "question,answer\n1+1?,2\n",
                                       "data.prompt_key 'problem' not found in {path} (fields: question, answer)"),
    "CSV with the answer cells empty": ("train.csv", "problem,answer\n1+1?,\n2+2?,\n",
                                        "data.train_split 'train' has no usable examples ({path} [train]: kept 0 of 2 "
                                        "rows; dropped 0 empty problem, 2 empty answer, 0 duplicate problem, 0 "
                                        "missing field)"),
    "CSV with an unquoted comma": ("train.csv", "problem,answer\nWhat is 1,000 + 1?,1001\n",
                                   "data.path {path} line 2 has 3 values for the header's 2 (problem, answer): quote "
                                   "values that hold commas"),
    "a number as problem": ("train.jsonl", '{"problem": 7, "answer": "2"}\n',
                            "data.prompt_key 'problem' in {path} row 0 holds a number (7), not text"),
    "null as problem": ("train.jsonl", '{"problem": null, "answer": "2"}\n',
                        "data.prompt_key 'problem' in {path} row 0 holds null, not text"),
    "a list as problem": ("train.jsonl", '{"problem": ["1+1?"], "answer": "2"}\n',
                          "data.prompt_key 'problem' in {path} row 0 holds a list, not text"),
    "a number as problem on row 3": ("train.jsonl", GOOD_ROW * 3 + '{"problem": 7.5, "answer": "2"}\n',
                                     "data.prompt_key 'problem' in {path} row 3 holds a number (7.5), not text"),
    "not parquet": ("train.parquet", "not parquet\n",
                    "data.path {path} is not a readable parquet file: Parquet magic bytes not found in footer. Either "
                    "the file is corrupted or this is not a parquet file."),
}
# A gsm8k-layout benchmark file (eval=gsm8k eval.data.path=...): name -> (text, the one line)
BROKEN_BENCHMARK = {
    "empty": ("", "eval.data.path {path} is empty (0 bytes)"),
    "malformed line": ('{"question": "1+1?" "answer": "#### 2"}\n',
                       "eval.data.path {path} line 1 is not valid JSON: Expecting ',' delimiter (column 21)"),
    "a number as question": ('{"question": 12, "answer": "#### 2"}\n',
                             "eval.data.prompt_key 'question' in {path} row 0 holds a number (12), not text"),
    "no question field": ('{"problem": "1+1?", "answer": "#### 2"}\n',
                          "eval.data.prompt_key: none of the gsm8k loader's defaults ('question') found in {path} "
                          "(fields: problem, answer); set eval.data.prompt_key"),
}


def broken_file(folder, name: str, text: str):
    path = folder / name
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def file_data_config():
    """The tiny model's config with data=file (a training split only), composed once: each case sets data.path."""
    return compose_config("data=file", "data.path=/placeholder.jsonl", "data.eval_split=null")


@pytest.mark.parametrize("case", BROKEN_DATA)
def test_a_broken_training_data_file_is_refused_in_one_line_at_start_up(tmp_path, file_data_config, case):
    from dataclasses import replace

    from tokenpo.preflight import check_inputs

    name, text, line = BROKEN_DATA[case]
    path = broken_file(tmp_path, name, text)
    cfg = replace(file_data_config, data=replace(file_data_config.data, path=str(path)))
    with pytest.raises(ConfigError) as err:
        check_inputs(cfg, tmp_path)
    assert str(err.value) == line.format(path=path)


@pytest.mark.parametrize("case", BROKEN_BENCHMARK)
def test_a_broken_benchmark_file_is_refused_in_one_line_naming_eval_data(tmp_path, case):
    from tokenpo.preflight import check_inputs

    text, line = BROKEN_BENCHMARK[case]
    path = broken_file(tmp_path, "gsm8k.jsonl", text)
    with pytest.raises(ConfigError) as err:
        check_inputs(compose_config("eval=gsm8k", f"eval.data.path={path}"), tmp_path)
    assert str(err.value) == line.format(path=path)


HEAVY_MODULES = ("torch", "transformers", "deepspeed")


@pytest.mark.parametrize(("case", "overrides"), [
    (BROKEN_DATA["empty"], ["data=file", "data.eval_split=null"]),
    (BROKEN_DATA["malformed line"], ["data=file", "data.eval_split=null"]),
    (BROKEN_DATA["CSV with the answer cells empty"], ["data=file", "data.eval_split=null"]),
    (BROKEN_DATA["a number as problem"], ["data=file", "data.eval_split=null"]),
    (("gsm8k.jsonl", *BROKEN_BENCHMARK["a number as question"]), ["eval=gsm8k"]),
], ids=["empty", "malformed line", "CSV answer cells empty", "number as problem", "benchmark: number as question"])
@pytest.mark.e2e
def test_the_cli_stops_on_a_broken_data_file_in_one_line_before_torch_is_imported(tmp_path, case, overrides):
    import os
    import subprocess
    import sys
    from pathlib import Path

    name, text, line = case
    path = broken_file(tmp_path, name, text)
    key = "eval.data.path" if "eval=gsm8k" in overrides else "data.path"
    # -X importtime: the process lists every module it imported, on stderr, as it imports it
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "tokenpo.train", "model=tiny", *overrides,
                           f"{key}={path}", "logger.mode=disabled", f"hydra.run.dir={tmp_path / 'run'}"],
                          cwd=Path(__file__).resolve().parents[1], env=dict(os.environ), capture_output=True,
                          text=True, timeout=120)
    imports = [row.rpartition("|")[2].strip() for row in proc.stderr.splitlines() if row.startswith("import time:")]
    printed = [row for row in (proc.stdout + proc.stderr).splitlines() if not row.startswith("import time:")]
    assert (proc.returncode, printed) == (2, [f"tokenpo: error: {line.format(path=path)}"])
    assert "tokenpo.preflight" in imports and not [m for m in imports if m.split(".")[0] in HEAVY_MODULES]

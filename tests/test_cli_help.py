"""Keys that explain themselves on the command line (issue 42, trap 4 and 8): `--explain` from the same `setting(...)`
that checks a key, a short `--help` with pointers, overrides accepted after `--info` / `--cfg`, and
`tokenpo.evaluate --help` explaining its own arguments."""

from __future__ import annotations

import subprocess
import sys

import pytest

from support.config import train_config
from support.env import REPO, cli_env
from tokenpo import CONF_DIR
from tokenpo.algorithms.config import LossConfig
from tokenpo.cli_help import all_keys, explain, explain_request, find, normalize_hydra_flags, short_help
from tokenpo.config import GROUPS
from tokenpo.errors import ConfigError
from tokenpo.schema import config_dict


def values(*overrides: str) -> dict:
    cfg = train_config(*overrides)
    return {"seed": cfg.seed, **{group: config_dict(getattr(cfg, group)) for group in GROUPS}}


def test_a_key_prints_its_help_default_rule_and_value_in_this_run():
    text = explain("algorithm.loss.clip_high", values("algorithm=dapo"), ["algorithm=dapo"], CONF_DIR)
    help_text = LossConfig.__dataclass_fields__["clip_high"].metadata["help"]
    assert text.splitlines()[0] == "algorithm.loss.clip_high  (float)"
    assert " ".join(line.strip() for line in text.splitlines()[1:3]).startswith(help_text[:60])
    assert "  default: 0.2" in text and "  in this run (algorithm=dapo): 0.28" in text and "  rule: >= 0" in text


def test_a_short_or_partial_name_finds_its_key_and_an_unknown_one_suggests():
    keys = all_keys()
    assert [k.key for k in find("algorithm.clip_high", keys)] == ["algorithm.loss.clip_high"]
    assert [k.key for k in find("group_size", keys)] == ["rollout.group_size"]
    text = explain("algorithm.clip_high", values(), [], CONF_DIR)
    assert text.startswith("(algorithm.clip_high is algorithm.loss.clip_high)")
    with pytest.raises(ConfigError, match=r"--explain trainer.max_step: no such key; did you mean trainer.max_steps"):
        explain("trainer.max_step", values(), [], CONF_DIR)
    with pytest.raises(ConfigError, match=r"--explain steps names \d+ keys: trainer.health.constant_reward.steps, "):
        explain("steps", values(), [], CONF_DIR)


def test_a_group_lists_its_options_and_each_key_with_its_help():
    text = explain("rollout", values("rollout.group_size=8"), ["rollout.group_size=8"], CONF_DIR)
    assert "options (rollout=<option>): hf, vllm" in text
    assert "rollout.group_size = 8  # Responses per prompt G" in text
    section = explain("algorithm.dynamic_sampling", values("algorithm=dapo"), [], CONF_DIR)
    assert "algorithm.dynamic_sampling.enabled = true  # drop groups" in section
    assert "algorithm.loss" not in section


def test_every_key_of_every_group_can_be_explained():
    for key in all_keys():
        if not key.is_section:
            assert explain(key.key, values(), [], CONF_DIR).startswith(key.key), key.key


def test_help_is_short_and_points_to_explain_and_the_docs():
    text = short_help(CONF_DIR)
    assert len(text.splitlines()) < 45
    assert "--explain KEY" in text and "docs/metrics.md" in text and "algorithm: cispo, clip_cov, dapo" in text


@pytest.mark.parametrize(("argv", "normal"), [
    (["--info", "model=tiny"], ["--info", "all", "model=tiny"]),
    (["--info"], ["--info"]),
    (["--info", "defaults", "model=tiny"], ["--info", "defaults", "model=tiny"]),
    (["--cfg", "algorithm=dapo"], ["--cfg", "job", "algorithm=dapo"]),
    (["model=tiny", "--cfg"], ["model=tiny", "--cfg", "job"]),
    (["--cfg", "hydra", "model=tiny"], ["--cfg", "hydra", "model=tiny"]),
])
def test_overrides_after_info_and_cfg_are_accepted(argv, normal):
    assert normalize_hydra_flags(argv) == normal


def test_explain_needs_a_key():
    assert explain_request(["model=tiny", "--explain", "seed", "seed=3"]) == ("seed", ["model=tiny", "seed=3"])
    with pytest.raises(ConfigError, match="--explain needs a key"):
        explain_request(["--explain"])


def run(module: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, env=cli_env(), capture_output=True,
                          text=True, timeout=120)


@pytest.mark.e2e
def test_the_command_line_answers_help_explain_and_cfg_with_overrides_after_it():
    explained = run("tokenpo.train", "--explain", "algorithm.clip_high", "algorithm=dapo")
    assert explained.returncode == 0 and "in this run (algorithm=dapo): 0.28" in explained.stdout, explained.stderr
    helped = run("tokenpo.train", "--help")
    assert helped.returncode == 0 and "--explain KEY" in helped.stdout and "== Config ==" not in helped.stdout
    cfg = run("tokenpo.train", "--cfg", "algorithm=dapo", "-p", "algorithm.loss.clip_high")
    assert cfg.returncode == 0 and cfg.stdout.strip() == "0.28", cfg.stderr
    info = run("tokenpo.train", "--info", "model=tiny")
    assert info.returncode == 0 and "Defaults List" in info.stdout, info.stderr
    unknown = run("tokenpo.train", "--explain", "trainer.foo")
    assert unknown.returncode == 2 and unknown.stderr.startswith("tokenpo: error: --explain trainer.foo: no such key")


@pytest.mark.e2e
def test_evaluate_help_explains_its_own_arguments():
    proc = run("tokenpo.evaluate", "--help")
    assert proc.returncode == 0, proc.stderr
    for argument in ("model_path=null: what to evaluate: a run dir", "output_dir=null: folder of eval.json",
                     "adapter_path=null", "benchmarks (eval=<option>): aime24"):
        assert argument in proc.stdout

"""DataConfig schema: the shipped conf/data files, unknown keys and invalid values."""

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from tokenpo import CONF_DIR
from tokenpo.data import data_config_from_dict, load_splits
from tokenpo.data.answers import DAPO_PREFIX, DAPO_SUFFIX
from tokenpo.errors import ConfigError

CONF_DATA = Path(CONF_DIR) / "data"
YAMLS = sorted(CONF_DATA.glob("*.yaml"))
# file and hub need the user's source; everything else must validate as shipped
REQUIRED_OVERRIDES = {"file": {"path": "data.jsonl"}, "hub": {"hub_id": "me/data"}}


def test_the_expected_data_configs_ship():
    assert {path.stem for path in YAMLS} == {"arith", "arith_study", "gsm8k", "math", "dapo_math_17k", "file", "hub"}


@pytest.mark.parametrize("path", YAMLS, ids=lambda p: p.stem)
def test_shipped_yaml_validates(path):
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        node = compose(f"data/{path.stem}").data  # composed with the option it starts from, as Hydra hands it over
    for key, value in REQUIRED_OVERRIDES.get(path.stem, {}).items():
        node[key] = value
    cfg = data_config_from_dict(node)
    base = (OmegaConf.load(path).get("defaults") or [path.stem])[0]  # a delta keeps its base's loader
    assert cfg.name == path.stem and cfg.loader == base


def test_arith_yaml_is_the_default_curriculum():
    cfg = data_config_from_dict(OmegaConf.load(CONF_DATA / "arith.yaml"))
    assert (cfg.arith.levels, cfg.arith.weights) == ([1, 2], [0.6, 0.4])
    assert (cfg.answer_format, cfg.answer_pattern, cfg.fallback) == ("number", "boxed", "last_number")
    assert cfg.template.mode == "chat" and "\\boxed{}" in cfg.template.instruction
    train, held_out = load_splits(cfg, seed=0)
    assert (len(train), len(held_out)) == (120, 64)


def test_dapo_yaml_wraps_problems_in_dapos_own_instruction():
    cfg = data_config_from_dict(OmegaConf.load(CONF_DATA / "dapo_math_17k.yaml"))
    assert cfg.template.raw_format == DAPO_PREFIX + "{problem}" + DAPO_SUFFIX
    assert (cfg.answer_pattern, cfg.answer_format) == ("answer_line", "number")


def test_unknown_keys_are_named():
    with pytest.raises(ConfigError, match=r"^unknown key data.promt_key \(known: .*prompt_key"):
        data_config_from_dict({"promt_key": "q"})
    with pytest.raises(ConfigError, match=r"^unknown key data.template.suffix \(known: instruction, mode, "):
        data_config_from_dict({"template": {"suffix": "x"}})
    with pytest.raises(ConfigError, match=r"^data.arith must be a mapping"):
        data_config_from_dict({"arith": 3})


@pytest.mark.parametrize(
    "values, message",
    [
        ({"loader": "gsm8"}, r"unknown data.loader 'gsm8'; known: aime24, aime25, amc23, arith, dapo_math_17k, file, "
                             r"gsm8k, hub, math, math500$"),
        ({"prompts_per_step": 0}, r"data.prompts_per_step must be an integer >= 1, got 0"),
        ({"max_eval_examples": 2.5}, r"data.max_eval_examples must be int or null, got 2.5"),
        ({"answer_format": "int"}, r"data.answer_format must be one of number, expression, got 'int'"),
        ({"answer_pattern": "hash"}, r"data.answer_pattern must be one of answer_line, boxed"),
        ({"fallback": "first_number"}, r"data.fallback must be one of last_dollar, last_number, none"),
        ({"max_prompt_tokens": -1}, r"data.max_prompt_tokens must be an integer >= 0 or null \(0 and null: no cap\)"),
        ({"overlong_prompt": "right"}, r"data.overlong_prompt must be one of drop, truncate_left, truncate_middle, "
                                       r"error, got 'right'"),
        ({"train_split": None, "eval_split": None}, r"data.train_split and data.eval_split are both null"),
        ({"loader": "gsm8k", "eval_split": "train"}, r"data.eval_split must differ from data.train_split"),
        ({"path": "x.jsonl"}, r"data.path is not used by loader 'arith'; set it to null"),
        ({"loader": "file"}, r"data.path must be set for loader 'file'"),
        ({"loader": "hub"}, r"data.hub_id must be set for loader 'hub'"),
        ({"loader": "gsm8k", "path": "gsm8k.jsonl"}, r"data.path 'gsm8k.jsonl' would serve both train and eval"),
        ({"hub_id": ""}, r"data.hub_id must be a non-empty string or null"),
        ({"template": {"mode": "text"}}, r"data.template.mode must be one of chat, raw"),
        ({"arith": {"weights": [1.0]}}, r"data.arith.weights must list one weight per level"),
    ],
)
def test_invalid_values_name_the_key(values, message):
    with pytest.raises(ConfigError, match=message):
        data_config_from_dict(values)

"""The reward config schema, its YAML mirror, and the merge with dataset defaults."""

from dataclasses import asdict, fields
from pathlib import Path

import pytest
import yaml

from tokenpo import CONF_DIR
from tokenpo.errors import ConfigError
from tokenpo.rewards import RewardConfig, resolve, reward_config_from_dict

YAML_PATH = Path(CONF_DIR) / "reward" / "default.yaml"


def test_yaml_mirrors_the_dataclass_with_a_comment_above_every_field():
    lines = YAML_PATH.read_text().splitlines()
    loaded = yaml.safe_load("\n".join(lines))
    assert loaded == asdict(RewardConfig())
    assert reward_config_from_dict(loaded) == RewardConfig()
    for index, line in enumerate(lines):
        if line and not line.startswith("#"):
            assert lines[index - 1].startswith("# "), f"no comment above {line!r}"
    keys_in_order = [line.split(":")[0] for line in lines if line and not line.startswith("#")]
    assert keys_in_order == [f.name for f in fields(RewardConfig)]


@pytest.mark.parametrize(
    "key, value",
    [("answer_format", "numbers"), ("answer_pattern", "xml"), ("fallback", "last"), ("format_weight", -1.0),
     ("format_weight", float("nan")), ("format_weight", "a"), ("timeout_s", 0.5), ("timeout_s", True),
     ("num_workers", 0), ("num_workers", True), ("num_workers", 2.0), ("fn", "no_colon"), ("fn", 3),
     ("reasoning_tag", "<think>"), ("reasoning_tag", ""), ("reasoning_tag", 3), ("worker_max_items", 0),
     ("worker_max_items", 1.5), ("worker_max_rss_mb", 0), ("worker_max_rss_mb", True)],
)
def test_bad_values_name_their_key(key, value):
    with pytest.raises(ConfigError, match=f"^reward.{key} ") as error:
        reward_config_from_dict({key: value})
    assert "\n" not in str(error.value)


def test_unknown_key_is_rejected():
    with pytest.raises(ConfigError, match=r"unknown key reward.answer_fromat \(known: answer_format,"):
        reward_config_from_dict({"answer_fromat": "number"})


def test_resolve_prefers_config_then_dataset_then_builtin():
    arith = {"answer_format": "number", "fallback": "last_number", "name": "arith"}
    resolved = resolve(RewardConfig(fallback="none"), arith)
    assert (resolved.answer_format, resolved.answer_pattern, resolved.fallback) == ("number", "boxed", "none")
    resolved = resolve(RewardConfig(), {})
    assert (resolved.answer_format, resolved.answer_pattern, resolved.fallback) == ("auto", "boxed", "none")


def test_resolve_rejects_a_bad_dataset_default():
    with pytest.raises(ConfigError, match="dataset's default fallback"):
        resolve(RewardConfig(), {"fallback": "first_number"})

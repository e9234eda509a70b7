"""Which algorithm settings cannot act under a run's settings (issue 42, trap 1 and 6): read from the registries'
traits, named at start-up in one line; one response per prompt refused where the estimator or dynamic sampling
needs a group."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from support.config import ALGORITHM_NAMES, train_config
from tokenpo.algorithms.inert import inert_on_policy, needs_group, registry_choices
from tokenpo.errors import ConfigError
from tokenpo.registry import Registry
from tokenpo.schema import setting


@pytest.mark.parametrize("name", ALGORITHM_NAMES)
def test_every_shipped_algorithm_names_what_one_update_per_rollout_switches_off_and_two_switch_on(name):
    one = train_config("model=tiny", f"algorithm={name}")
    line = one.inert_components()
    # every surrogate has a clip or gate that only a ratio away from 1 can reach
    assert line is not None and "trainer.mini_batches=2" in line, name
    assert train_config("model=tiny", f"algorithm={name}", "trainer.mini_batches=2").inert_components() is None


def test_the_readme_algorithms_name_their_own_parts():
    assert inert_on_policy(train_config("model=tiny", "algorithm=dapo").algorithm) == [
        "algorithm.loss.clip_low=0.2", "algorithm.loss.clip_high=0.28"]
    assert inert_on_policy(train_config("model=tiny", "algorithm=tepo").algorithm) == [
        "algorithm.ratio.kind=sequence_token", "algorithm.loss.clip_low=0.2", "algorithm.loss.clip_high=0.28",
        "algorithm.loss.kl_mask_entropy_ref=old_token", "algorithm.loss.kl_mask_target=old"]
    grpo_s = inert_on_policy(train_config("model=tiny", "algorithm=grpo_s").algorithm)
    assert grpo_s[0] == "algorithm.ratio.kind=sequence_arithmetic"


def test_a_setting_that_is_not_read_is_not_named():
    # the masked KL off: its entropy reference and target are read by nothing
    off = train_config("model=tiny", "algorithm=tepo", "algorithm.loss.kl_mask_coef=0").algorithm
    assert not any("kl_mask" in item for item in inert_on_policy(off))
    # a KL to the rollout policy is 0 on-policy; at kl_coef 0 there is no such term
    assert "algorithm.loss.kl_target=old" in inert_on_policy(
        train_config("model=tiny", "algorithm.loss.kl_target=old").algorithm)
    assert "algorithm.loss.kl_target=old" not in inert_on_policy(
        train_config("model=tiny", "algorithm.loss.kl_target=old", "algorithm.loss.kl_coef=0").algorithm)


def test_rollouts_ahead_of_the_update_make_the_ratios_act_without_mini_batches():
    plain = train_config("model=tiny", "algorithm=dapo", "rollout.async.max_staleness=1", "rollout.async.decoupled=false")
    assert plain.inert_components() is None
    decoupled = train_config("model=tiny", "algorithm=dapo", "rollout.async.max_staleness=1")
    assert decoupled.inert_components() is not None  # its clip reads the ratio to the update's own start


def test_a_new_registry_entry_is_read_from_its_traits_not_from_a_list():
    kinds = Registry("test kind")
    kinds.add("plain", lambda: None)
    kinds.add("clipping", lambda: None, inert_on_policy=("bound",))
    kinds.add("pairwise", lambda: None, needs_group=True)

    @dataclass
    class Section:
        kind: str = setting("plain", "a kind", choices=kinds.names)
        bound: float | None = setting(0.5, "a bound")

    @dataclass
    class Root:
        part: Section = None

    assert [c.key for c in registry_choices(Root(Section()))] == ["algorithm.part.kind"]
    assert inert_on_policy(Root(Section())) == []
    assert inert_on_policy(Root(Section("clipping"))) == ["algorithm.part.bound=0.5"]
    assert inert_on_policy(Root(Section("clipping", None))) == []
    assert needs_group(Root(Section("pairwise"))) == "algorithm.part.kind=pairwise"
    assert needs_group(Root(Section("clipping"))) is None


@pytest.mark.parametrize(("overrides", "message"), [
    (["algorithm=grpo"], "rollout.group_size=1 with algorithm.advantage.estimator=grpo, which compares"),
    (["algorithm=dr_grpo"], "algorithm.advantage.estimator=grpo"),
    (["algorithm=grpo_s"], "algorithm.advantage.estimator=grpo_s"),
    (["algorithm=gtpo"], "algorithm.advantage.estimator=gtpo (algorithm.advantage.scope=group)"),
    (["algorithm=dapo", "algorithm.advantage.estimator=gtpo", "algorithm.advantage.scope=batch"],
     "rollout.group_size=1 with algorithm.dynamic_sampling.enabled=true"),
])
def test_one_response_per_prompt_is_refused_where_a_group_is_needed(overrides, message):
    with pytest.raises(ConfigError, match="use rollout.group_size >= 2") as error:
        train_config("model=tiny", *overrides, "rollout.group_size=1")
    assert message in str(error.value)


def test_one_response_per_prompt_is_accepted_where_the_statistics_run_over_the_step():
    cfg = train_config("model=tiny", "algorithm=gtpo", "algorithm.advantage.scope=batch",
                       "algorithm.dynamic_sampling.enabled=false", "rollout.group_size=1")
    assert cfg.rollout.group_size == 1

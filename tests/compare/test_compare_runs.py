import json

import pytest

from tokenpo.compare.runs import (
    ALL_RUNS,
    Run,
    discover_run_dirs,
    environment_lines,
    find_group,
    group_runs,
    load_run,
    missing_metric_notes,
    parse_overrides,
)
from tokenpo.errors import ConfigError


def make_run(name, **overrides):
    return Run(name, {key.replace("__", "."): str(value) for key, value in overrides.items()}, [{"step": 1.0}])


def test_parse_overrides_drops_plus_prefixes_and_splits_on_first_equals():
    parsed = parse_overrides(["algorithm=gtpo", "+trainer.x=1", "++seed=2", "data.filter=a=b"])
    assert parsed == {"algorithm": "gtpo", "trainer.x": "1", "seed": "2", "data.filter": "a=b"}


def test_discover_finds_run_dirs_recursively_once(multirun):
    found = discover_run_dirs([multirun, multirun / "3"])
    assert sorted(path.name for path in found) == ["0", "1", "2", "3", "4", "5", "6"]
    with pytest.raises(FileNotFoundError, match="no such directory"):
        discover_run_dirs([multirun / "nope"])


def test_truncated_last_line_is_skipped_and_reported(multirun):
    run = load_run(multirun / "5")
    assert [record["step"] for record in run.records] == [1.0, 2.0, 3.0, 4.0]
    assert run.overrides == {"algorithm": "dapo", "seed": "2", "trainer.max_steps": "4"}
    assert any("skipped 1 unreadable line(s)" in problem for problem in run.problems)


def test_run_without_metrics_is_reported(multirun):
    run = load_run(multirun / "6")
    assert run.records == [] and run.problems == [f"run {multirun / '6'}: no metrics.jsonl yet"]


def test_repeated_step_keeps_last_line_and_non_finite_values_are_counted(tmp_path):
    lines = [{"step": 1, "m": 1.0}, {"step": 2, "m": 2.0}, {"step": 2, "m": 5.0, "x": float("nan"), "s": "a"}]
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    run = load_run(tmp_path)
    assert run.records == [{"step": 1.0, "m": 1.0}, {"step": 2.0, "m": 5.0}]
    assert run.overrides == {}
    assert run.problems == [f"run {tmp_path}: skipped 2 non-numeric or non-finite value(s)"]


def test_grouping_averages_seeds_and_drops_constant_keys():
    runs = [make_run(f"r{a}{s}", algorithm=a, seed=s, trainer__max_steps=20) for a in ("grpo", "dapo") for s in range(3)]
    groups = group_runs(runs, ["seed"])
    assert list(groups) == ["algorithm=dapo", "algorithm=grpo"]
    assert [run.path for run in groups["algorithm=grpo"]] == ["rgrpo0", "rgrpo1", "rgrpo2"]


def test_grouping_matches_nested_seed_and_keeps_group_by_keys():
    runs = [make_run("a", algorithm="grpo", data__seed=1, lr=1), make_run("b", algorithm="grpo", data__seed=2, lr=2)]
    assert list(group_runs(runs, ["seed"])) == ["lr=1", "lr=2"]
    assert list(group_runs(runs, ["seed", "lr"])) == [ALL_RUNS]
    assert list(group_runs(runs, ["seed"], ["algorithm"])) == ["algorithm=grpo"]
    with pytest.raises(ConfigError, match="--group-by model"):
        group_runs(runs, ["seed"], ["model"])


def test_a_key_a_run_does_not_set_stays_out_of_its_label():
    """The study's GTPO control is `experiment=...` beside `algorithm=...` runs: each label names what its runs set."""
    runs = [make_run("a", algorithm="grpo", seed=0), make_run("b", algorithm="grpo", seed=1),
            make_run("c", experiment="gtpo/alpha2_0_control", seed=0)]
    groups = group_runs(runs, ["seed"])
    assert {label: [run.path for run in group] for label, group in groups.items()} == {
        "algorithm=grpo": ["a", "b"], "experiment=gtpo/alpha2_0_control": ["c"]}
    assert find_group(groups, "algorithm=grpo") == "algorithm=grpo"


def test_find_group_needs_exactly_one_match():
    groups = group_runs([make_run("a", algorithm="grpo", lr=1), make_run("b", algorithm="dapo", lr=2)], ["seed"])
    assert find_group(groups, "algorithm=dapo") == "algorithm=dapo lr=2"
    with pytest.raises(ConfigError, match="matches 0 groups"):
        find_group(groups, "algorithm=gtpo")


def test_missing_metric_notes_name_the_group_or_metric():
    with_kl = Run("a", {"algorithm": "grpo"}, [{"step": 1.0, "kl/ref": 0.1}])
    without_kl = Run("b", {"algorithm": "dapo"}, [{"step": 1.0}])
    groups = group_runs([with_kl, without_kl], ["seed"])
    assert missing_metric_notes(groups, ["kl/ref", "kl/old"]) == [
        "group algorithm=dapo: no kl/ref values",
        "metric kl/old: logged by no run",
    ]


def test_baseline_selector_matches_numbers_in_any_spelling():
    from tokenpo.compare.runs import same_value

    assert same_value("2e-05", "2e-5") and same_value("0.10", "0.1") and same_value("grpo", "grpo")
    assert not same_value("2e-05", "3e-5") and not same_value(None, "1") and not same_value("grpo", "dapo")


def test_environment_lines_name_each_environment_and_warn_when_there_are_several(tmp_path):
    here = {"device": "AMD EPYC", "cpu_capability": "AVX2", "threads": 1, "processes": 1, "torch": "2.13.0",
            "transformers": "5.24.0", "deepspeed": "0.19.8"}
    elsewhere = {**here, "cpu_capability": "AVX512"}
    one = {"algorithm=grpo": [Run(tmp_path / "a", {}, [], environments=[{"from_step": 0, **here}]),
                              Run(tmp_path / "b", {}, [], environments=[{"from_step": 0, **here}])]}
    assert environment_lines(one) == [
        "- AMD EPYC (AVX2), 1 thread(s) x 1 process(es), torch 2.13.0, transformers 5.24.0, deepspeed 0.19.8: 2 run(s)"
    ]
    # a run resumed on another machine counts in both; a run from before the record counts apart
    mixed = {
        "algorithm=dapo": [Run(tmp_path / "c", {}, [], environments=[{"from_step": 0, **here},
                                                                    {"from_step": 4, **elsewhere}])],
        "algorithm=grpo": [Run(tmp_path / "d", {}, [], environments=[{"from_step": 0, **here}]),
                           Run(tmp_path / "e", {}, [])],
    }
    lines = environment_lines(mixed)
    assert lines[0].startswith("The runs were measured in 2 environments")
    assert lines[1].startswith("- AMD EPYC (AVX2), 1 thread(s)") and lines[1].endswith(
        ": 2 run(s) (algorithm=dapo, algorithm=grpo)")
    assert lines[2].startswith("- AMD EPYC (AVX512)") and lines[2].endswith(": 1 run(s) (algorithm=dapo)")
    assert lines[3] == "- 1 run(s) without environment.json (from before tokenpo recorded it)"


def test_an_unreadable_environment_file_is_a_note_not_a_failure(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "environment.json").write_text('[{"device": ')
    run = load_run(run_dir)
    assert run.environments == []
    assert any("unreadable environment.json" in problem for problem in run.problems)

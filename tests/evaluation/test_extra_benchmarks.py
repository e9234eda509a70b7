"""eval.extra (more benchmarks at the same steps), eval.before_training, the training-split guard of
load_benchmark, and the study's data (data=arith_study eval=arith_study: 200 held-out + 200 transfer problems)."""

from __future__ import annotations

import logging

import pytest

from support.config import compose_evaluate, compose_tree, train_config
from tokenpo.config import build_config
from tokenpo.data import Example, load_splits
from tokenpo.errors import ConfigError
from tokenpo.evaluation.benchmark import load_benchmark
from tokenpo.evaluation.cli import build_eval_run
from tokenpo.evaluation.config import EvalConfig
from tokenpo.schema import from_dict


def eval_config(values: dict) -> EvalConfig:
    cfg = from_dict(EvalConfig, values, "eval")
    cfg.validate()
    return cfg


def study_config():
    return train_config("data=arith_study", "eval=arith_study")


def test_extra_benchmark_keeps_the_main_protocol_and_replaces_its_own_keys():
    main = eval_config({"name": "held_out", "max_problems": 50, "n": 4, "pass_k": [1, 2], "temperature": 0.6,
                        "every_steps": 5, "extra": [{"name": "transfer", "max_problems": 7, "data": {"loader": "x"}}]})
    benchmarks = main.benchmarks()
    assert [b.name for b in benchmarks] == ["held_out", "transfer"] and benchmarks[0] is main
    transfer = benchmarks[1]
    assert (transfer.max_problems, transfer.data, transfer.extra) == (7, {"loader": "x"}, ())
    assert (transfer.n, transfer.pass_k, transfer.temperature, transfer.every_steps) == (4, (1, 2), 0.6, 5)
    assert eval_config({"name": "only"}).benchmarks() == [eval_config({"name": "only"})]


@pytest.mark.parametrize(("extra", "message"), [
    ([{"name": "arith"}], r"eval.name and eval.extra names must differ .* got \['arith', 'arith'\]"),
    ([{"name": "b"}, {"name": "b"}], r"names must differ"),
    ([{"name": "b", "every_steps": 2}], r"eval.extra\[0\] sets every_steps: extra benchmarks are evaluated with"),
    ([{"name": "b", "extra": []}], r"eval.extra\[0\] sets extra"),
    ([{"max_problems": 3}], r"eval.extra\[0\] must be a mapping of eval keys with a name"),
    (["b"], r"eval.extra\[0\] must be a mapping"),
    ([{"name": "b", "n": -1}], r"^eval.extra\[0\] \(b\): eval.n must be >= 0, got -1$"),
    ([{"name": "b", "nn": 1}], r"unknown key eval.extra\[0\].nn"),
])
def test_bad_extra_benchmark_is_a_one_line_config_error(extra, message):
    with pytest.raises(ConfigError, match=message):
        eval_config({"name": "arith", "extra": extra})


def test_only_an_extra_benchmark_may_be_final_only():
    assert eval_config({"name": "a", "extra": [{"name": "b", "final_only": True}]}).benchmarks()[1].final_only
    with pytest.raises(ConfigError, match="^eval.final_only is for an eval.extra benchmark"):
        eval_config({"name": "a", "final_only": True})


def test_extra_benchmark_data_fails_at_start_up():
    tree = compose_tree("train", ["eval=arith_study", "eval.extra.0.data.loader=nope"])
    with pytest.raises(ConfigError, match="nope"):
        build_config(tree)


def test_load_benchmark_leaves_out_training_problems_before_the_cut(caplog):
    held_out = [Example(uid=str(i), problem=f"What is {i} + 1?", answer=str(i + 1)) for i in range(5)]
    train = [Example(uid="t", problem=" What is 1 + 1? ", answer="2"),
             Example(uid="u", problem="What is 3 + 1?", answer="4")]
    cfg = eval_config({"name": "b", "max_problems": 2})
    with caplog.at_level(logging.INFO, logger="tokenpo"):
        examples, _ = load_benchmark(cfg, None, 0, None, data_eval=held_out, train=train)
    assert [ex.uid for ex in examples] == ["0", "2"]
    assert "eval b: left out 2 of 5 problems that are also in the training split" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="tokenpo"):
        examples, _ = load_benchmark(eval_config({"name": "b", "max_problems": None}), None, 0, None,
                                     data_eval=held_out)
    assert len(examples) == 5 and "left out" not in caplog.text


def test_study_held_out_split_is_200_problems_of_the_training_mix():
    cfg = study_config()
    train, held_out = load_splits(cfg.data, cfg.seed)
    assert cfg.eval.max_problems == 200 and not cfg.eval.before_training and cfg.eval.every_steps == 0
    levels = lambda examples: [sum(ex.meta["level"] == level for ex in examples) for level in (1, 2)]  # noqa: E731
    assert (len(train), levels(train)) == (120, [42, 78])
    assert (len(held_out), levels(held_out)) == (200, [70, 130])
    assert not {ex.problem for ex in train} & {ex.problem for ex in held_out}


def test_study_transfer_set_is_200_two_digit_problems_outside_the_training_split(caplog):
    cfg = study_config()
    train, held_out = load_splits(cfg.data, cfg.seed)
    main, transfer = cfg.eval.benchmarks()
    assert transfer.name == "arith_transfer" and transfer.greedy and transfer.n == 0
    with caplog.at_level(logging.INFO, logger="tokenpo"):
        examples, data = load_benchmark(transfer, cfg.data, cfg.seed, None, held_out, train)
    assert len(examples) == 200 and all(ex.meta["level"] == 2 for ex in examples)
    assert not {ex.problem for ex in examples} & {ex.problem for ex in train}
    # the transfer draw held 2 of the training split's 78 two-digit problems: left out, and said so
    assert "eval arith_transfer: left out 2 of 220 problems" in caplog.text
    # the training prompt and answer reading, so only the problems differ from the held-out set
    assert data.template == cfg.data.template
    assert (data.answer_format, data.answer_pattern, data.fallback) == ("number", "boxed", "last_number")
    main_examples, _ = load_benchmark(main, cfg.data, cfg.seed, None, held_out, train)
    assert main_examples == held_out


def test_evaluate_cli_refuses_extra_benchmarks_in_one_line(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    tree = compose_evaluate([f"model_path={tmp_path}", "eval=arith_study"])
    with pytest.raises(ConfigError, match=r"^eval.extra lists 1 more benchmark\(s\): tokenpo.evaluate scores one"):
        build_eval_run(tree)

"""Every loader on small fixture files in the hub layouts, field mappings, bad data and the hub code path."""

import sys
import types
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from tokenpo import CONF_DIR
from tokenpo.data import build_prompt, data_config_from_dict, load_split, load_splits
from tokenpo.data.answers import DAPO_PREFIX, DAPO_SUFFIX
from tokenpo.data.loaders import check_local_files
from tokenpo.errors import ConfigError

CONF_DATA = Path(CONF_DIR) / "data"


def test_gsm8k_answers_after_hashes_without_commas_and_bad_rows_counted(make_cfg, fixtures_dir):
    cfg = make_cfg(name="gsm8k", loader="gsm8k", path=str(fixtures_dir / "gsm8k_{split}.jsonl"))
    train, report = load_split(cfg, "train", seed=0)
    assert [(e.problem, e.answer) for e in train] == [
        ("Ann has 3 pens and buys 4 more. How many pens does she have?", "7"),
        ("A farm sells 1,000 eggs a day for 2 days. How many eggs?", "2000"),
        ("Cid walks 2 km each day for 5 days. How far does he walk?", "10"),
    ]
    assert [e.uid for e in train] == ["gsm8k/train/0", "gsm8k/train/1", "gsm8k/train/5"]
    # row 2: blank question; row 3: row 0 with an extra space; row 4: no "####" marker
    assert (report.rows_read, report.kept, report.empty_problem, report.duplicate_problem, report.empty_answer) == (
        6, 3, 1, 1, 1)
    assert report.dropped == 3
    test, _ = load_split(cfg, "eval", seed=0)
    assert [e.answer for e in test] == ["36", "1000"]


def test_math_answer_is_last_balanced_boxed_of_solution(make_cfg, fixtures_dir):
    cfg = make_cfg(loader="math", name="math", path=str(fixtures_dir / "math_train.jsonl"), eval_split=None)
    examples, report = load_split(cfg, "train", seed=0)
    assert [e.answer for e in examples] == ["\\frac{1}{2}", "3", "4"]
    assert examples[0].meta == {"row": 0, "level": "Level 1", "type": "Prealgebra"}
    assert report.empty_answer == 1  # the unclosed \boxed{ in the last row


@pytest.mark.parametrize("loader", ["math", "math500"])
def test_math500_layout_uses_the_answer_field(make_cfg, fixtures_dir, loader):
    cfg = make_cfg(loader=loader, name=loader, path=str(fixtures_dir / "math500.jsonl"), train_split=None)
    examples, _ = load_split(cfg, "eval", seed=0)
    # the fixture's second answer field ("\frac12") differs from its solution's box, so the source is visible
    assert [e.answer for e in examples] == ["4", "\\frac12"]
    assert examples[1].meta["unique_id"] == "test/prealgebra/2.json"


def test_math_answer_key_solution_reads_the_box(make_cfg, fixtures_dir):
    cfg = make_cfg(loader="math", name="m", path=str(fixtures_dir / "math500.jsonl"), train_split=None,
                   answer_key="solution")
    examples, _ = load_split(cfg, "eval", seed=0)
    assert [e.answer for e in examples] == ["4", "\\frac{1}{2}"]


def test_dapo_parquet_strips_instruction_and_dedups(make_cfg, dapo_parquet):
    cfg = make_cfg(loader="dapo_math_17k", name="dapo", path=str(dapo_parquet), eval_split=None)
    examples, report = load_split(cfg, "train", seed=0)
    assert [(e.problem, e.answer) for e in examples] == [
        ("In triangle $ABC$, $AB = 5$ and $BC = 12$ with a right angle at $B$. Find $AC$.", "13"),
        ("Find the number of positive divisors of $36$.", "9"),
    ]
    assert report.duplicate_problem == 1
    original = DAPO_PREFIX + examples[1].problem + DAPO_SUFFIX
    assert examples[1].meta == {"row": 1, "original_prompt": original, "data_source": "math_dapo", "index": "idx-1"}


def test_dapo_yaml_template_reproduces_the_original_prompt(dapo_parquet):
    values = OmegaConf.to_container(OmegaConf.load(CONF_DATA / "dapo_math_17k.yaml"))
    cfg = data_config_from_dict({**values, "path": str(dapo_parquet)})
    train, _ = load_splits(cfg, seed=0)
    for example in train:
        assert build_prompt(example.problem, None, cfg.template) == example.meta["original_prompt"]


@pytest.mark.parametrize(
    "loader, filename, expected",
    [
        ("aime24", "aime_problem.jsonl", [("Find the remainder when $2^{10}$ is divided by $1000$.", "024"),
                                           ("Find $7 \\cdot 11$.", "77")]),
        ("aime25", "aime_question.jsonl", [("Find $3^5$.", "243")]),
        ("amc23", "amc23.jsonl", [("Cities are 45 miles apart ...", "27.0"), ("Compute $1/2+1/4$.", "0.75")]),
    ],
)
def test_competition_loaders_accept_problem_or_question_and_numeric_answers(make_cfg, fixtures_dir, loader,
                                                                             filename, expected):
    cfg = make_cfg(loader=loader, name=loader, path=str(fixtures_dir / filename), train_split=None)
    examples, _ = load_split(cfg, "eval", seed=0)
    assert [(e.problem, e.answer) for e in examples] == expected


@pytest.mark.parametrize("filename", ["custom.csv", "custom.json", "custom.parquet"])
def test_file_loader_with_custom_mapping(make_cfg, fixtures_dir, custom_parquet, filename):
    path = custom_parquet if filename.endswith(".parquet") else fixtures_dir / filename
    cfg = make_cfg(loader="file", name="custom", path=str(path), eval_split=None, prompt_key="q", answer_key="gold")
    examples, report = load_split(cfg, "train", seed=0)
    answers = {"custom.json": ["7", "5.0"]}.get(filename, ["7", "5"])
    assert [(e.problem, e.answer) for e in examples] == list(zip(["What is 6 + 1?", "What is 8 - 3?"], answers))
    assert report.empty_problem == (1 if filename == "custom.csv" else 0)


def test_file_loader_dotted_paths_and_missing_field_later_row_counted(make_cfg, fixtures_dir):
    cfg = make_cfg(loader="file", name="nested", path=str(fixtures_dir / "custom.jsonl"), eval_split=None,
                   prompt_key="item.text", answer_key="label.value")
    examples, report = load_split(cfg, "train", seed=0)
    assert [(e.problem, e.answer) for e in examples] == [("What is 6 + 1?", "7")]
    assert (report.empty_answer, report.missing_field) == (1, 1)


def test_wrong_prompt_key_names_field_file_and_fields(make_cfg, fixtures_dir):
    path = fixtures_dir / "aime_question.jsonl"
    cfg = make_cfg(loader="file", name="x", path=str(path), eval_split=None, prompt_key="problem", answer_key="answer")
    with pytest.raises(ConfigError) as error:
        load_split(cfg, "train", seed=0)
    assert str(error.value) == f"data.prompt_key 'problem' not found in {path} (fields: id, question, answer)"


def test_loader_defaults_missing_are_listed(make_cfg, fixtures_dir):
    path = fixtures_dir / "custom.json"
    cfg = make_cfg(loader="aime24", name="x", path=str(path), train_split=None)
    message = (r"data.prompt_key: none of the aime24 loader's defaults \('problem', 'question'\) found in "
               r".*custom.json \(fields: q, gold\); set data.prompt_key")
    with pytest.raises(ConfigError, match=message):
        load_split(cfg, "eval", seed=0)


def test_file_loader_needs_a_mapping(make_cfg, fixtures_dir):
    cfg = make_cfg(loader="file", name="x", path=str(fixtures_dir / "custom.json"), eval_split=None)
    with pytest.raises(ConfigError, match=r"^data.prompt_key must be set for loader 'file' \(fields in .*: q, gold\)$"):
        load_split(cfg, "train", seed=0)


def test_prompt_field_that_is_not_text_is_a_clear_error(make_cfg, fixtures_dir):
    cfg = make_cfg(loader="file", name="x", path=str(fixtures_dir / "custom.jsonl"), eval_split=None,
                   prompt_key="item", answer_key="label.value")
    with pytest.raises(ConfigError, match=r"data.prompt_key 'item' in .*custom.jsonl row 0 holds an object, not text"):
        load_split(cfg, "train", seed=0)


def test_bad_json_line_and_missing_file_and_suffix(make_cfg, tmp_path):
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"problem": "a", "answer": "1"}\n{"problem": \n')
    cfg = make_cfg(loader="file", name="x", path=str(broken), eval_split=None, prompt_key="problem",
                   answer_key="answer")
    with pytest.raises(ConfigError, match=r"^data.path .*broken.jsonl line 2 is not valid JSON: "):
        load_split(cfg, "train", seed=0)
    for name, message in [("absent.jsonl", "does not exist"), ("data.txt", "unsupported suffix")]:
        if name == "data.txt":
            (tmp_path / name).write_text("x")
        cfg = make_cfg(loader="file", name="x", path=str(tmp_path / name), eval_split=None, prompt_key="p",
                       answer_key="a")
        with pytest.raises(ConfigError, match=message):
            load_split(cfg, "train", seed=0)


def test_split_caps_train_seeded_subset_eval_first_rows(make_cfg, fixtures_dir):
    cfg = make_cfg(name="gsm8k", loader="gsm8k", path=str(fixtures_dir / "gsm8k_{split}.jsonl"),
                   max_train_examples=2, max_eval_examples=1)
    full, _ = load_split(make_cfg(name="gsm8k", loader="gsm8k", path=str(fixtures_dir / "gsm8k_{split}.jsonl")),
                         "train", seed=0)
    subsets = {seed: [e.uid for e in load_split(cfg, "train", seed)[0]] for seed in range(8)}
    for uids in subsets.values():
        assert len(uids) == 2 and set(uids) <= {e.uid for e in full}
        assert uids == sorted(uids, key=[e.uid for e in full].index)  # original order kept
    assert subsets[3] == [e.uid for e in load_split(cfg, "train", 3)[0]]
    assert len({tuple(uids) for uids in subsets.values()}) > 1  # the subset depends on the seed
    assert [e.answer for e in load_split(cfg, "eval", seed=5)[0]] == ["36"]


def test_load_splits_null_split_is_empty_and_empty_split_is_an_error(make_cfg, fixtures_dir, tmp_path):
    cfg = make_cfg(loader="aime24", name="aime", path=str(fixtures_dir / "aime_problem.jsonl"), train_split=None)
    train, held_out = load_splits(cfg, seed=0)
    assert train == [] and len(held_out) == 2
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    cfg = make_cfg(loader="aime24", name="aime", path=str(empty), train_split=None)
    with pytest.raises(ConfigError, match=r"data.eval_split 'test' has no usable examples"):
        load_splits(cfg, seed=0)


def test_hub_source_uses_default_ids_and_the_same_mapping(make_cfg, monkeypatch):
    calls = []
    rows = [{"question": "What is 1 + 1?", "answer": "#### 2"}, {"question": "", "answer": "#### 3"}]

    def load_dataset(hub_id, config, split):
        calls.append((hub_id, config, split))
        return rows

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    examples, report = load_split(make_cfg(name="gsm8k", loader="gsm8k"), "eval", seed=0)
    assert calls == [("openai/gsm8k", "main", "test")]
    assert [(e.problem, e.answer) for e in examples] == [("What is 1 + 1?", "2")]
    assert (report.source, report.empty_problem) == ("hub:openai/gsm8k[main]", 1)
    load_split(make_cfg(name="h", loader="hub", hub_id="me/data", prompt_key="question", answer_key="answer"),
               "train", seed=0)
    assert calls[-1] == ("me/data", None, "train")


def test_hub_without_datasets_package_is_a_clear_error(make_cfg, monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # makes `import datasets` fail
    with pytest.raises(ConfigError, match=r"data.hub_id 'openai/gsm8k' needs the `datasets` package"):
        load_split(make_cfg(name="gsm8k", loader="gsm8k"), "train", seed=0)


def test_every_named_loader_has_a_hub_id():
    from tokenpo.data.loaders import TABLE_SPECS

    named = ["gsm8k", "math", "math500", "dapo_math_17k", "aime24", "aime25", "amc23"]
    assert all(TABLE_SPECS[name].hub_id for name in named)


def test_start_up_file_check_reads_each_split_head(make_cfg, fixtures_dir, tmp_path):
    check_local_files(make_cfg(name="gsm8k", loader="gsm8k", path=str(fixtures_dir / "gsm8k_{split}.jsonl")))
    check_local_files(make_cfg(name="gsm8k", loader="gsm8k", hub_id="org/absent"))  # hub data: checked when loaded
    missing = make_cfg(name="gsm8k", loader="gsm8k", path=str(tmp_path / "gsm8k_{split}.jsonl"))
    with pytest.raises(ConfigError, match=f"data.path {tmp_path / 'gsm8k_train.jsonl'} does not exist"):
        check_local_files(missing)
    wrong_key = make_cfg(name="x", loader="file", path=str(fixtures_dir / "custom.jsonl"), eval_split=None,
                         prompt_key="nope", answer_key="answer")
    with pytest.raises(ConfigError, match="data.prompt_key 'nope' not found in"):
        check_local_files(wrong_key)


def deep_file(folder: Path, bad_line: str) -> Path:
    """5000 good rows, then `bad_line` as row 5000: past the rows the start-up check reads."""
    path = folder / "train.jsonl"
    path.write_text("".join(f'{{"problem": "{i} + 1?", "answer": "{i + 1}"}}\n' for i in range(5000)) + bad_line)
    return path


@pytest.mark.parametrize(("bad_line", "message"), [
    ('{"problem": "5000 + 1?", \n', "data.path {path} line 5001 is not valid JSON: Expecting property name enclosed "
                                    "in double quotes (column 26)"),
    ('{"problem": 5000, "answer": "5001"}\n', "data.prompt_key 'problem' in {path} row 5000 holds a number (5000), "
                                              "not text"),
], ids=["malformed line", "number as problem"])
def test_a_broken_row_deep_in_the_file_is_refused_in_one_line_when_the_data_loads(make_cfg, tmp_path, bad_line,
                                                                                  message):
    from tokenpo.data.loaders import CHECKED_ROWS

    assert CHECKED_ROWS < 5000
    path = deep_file(tmp_path, bad_line)
    cfg = make_cfg(loader="file", name="x", path=str(path), eval_split=None, prompt_key="problem", answer_key="answer")
    check_local_files(cfg)  # start-up reads the head only
    # loading reads every row, before the first step (the trainer loads both splits as lists)
    with pytest.raises(ConfigError) as err:
        load_splits(cfg, seed=0)
    assert str(err.value) == message.format(path=path)


def test_rows_lacking_a_field_or_text_deep_in_the_file_are_dropped_and_counted(make_cfg, tmp_path):
    path = deep_file(tmp_path, '{"problem": "5000 + 1?"}\n{"problem": "", "answer": "1"}\n')
    cfg = make_cfg(loader="file", name="x", path=str(path), eval_split=None, prompt_key="problem", answer_key="answer")
    check_local_files(cfg)
    examples, report = load_split(cfg, "train", seed=0)
    assert (len(examples), report.rows_read, report.missing_field, report.empty_problem) == (5000, 5002, 1, 1)

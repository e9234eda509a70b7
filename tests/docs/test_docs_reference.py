"""scripts/docs_reference.py: the generated reference pages (docs/reference/config.md, cli.md) are what the code
says now, every command the package installs is in them, and a key added to the schema appears with its type,
default, rule and help without an edit to the generator."""

from __future__ import annotations

import importlib.util
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

from tokenpo.schema import section, setting

REPO = Path(__file__).resolve().parents[2]
SPEC = importlib.util.spec_from_file_location("docs_reference", REPO / "scripts" / "docs_reference.py")
docs_reference = importlib.util.module_from_spec(SPEC)
sys.modules[SPEC.name] = docs_reference
SPEC.loader.exec_module(docs_reference)


def test_the_reference_pages_are_up_to_date():
    stale = [path.relative_to(REPO).as_posix() for path, text in docs_reference.pages().items()
             if not path.is_file() or path.read_text() != text]
    assert not stale, f"out of date: {stale}; run python scripts/docs_reference.py"


@dataclass
class Inner:
    depth: int = setting(3, "how deep (layers)", ge=1)


@dataclass
class Outer:
    rate: float | None = setting(None, "a rate | or none (per step; paper: 0.1)", gt=0, lt=1)
    kind: str = setting("a", "which kind", choices=("a", "b"))
    names: list[str] = setting(["x"], "names, `<like> | this`")
    inner: Inner = section(Inner, "the inner part")


def test_a_new_key_appears_with_its_type_default_rule_and_help():
    sections = docs_reference.schema_sections(Outer, "group", "", {"rate": 0.5, "inner": {"depth": 3}})
    assert [s.key for s in sections] == ["group", "group.inner"]
    rate, kind, names = sections[0].keys
    assert rate == docs_reference.Key("group.rate", "float or null", "`0.5`", "null or in (0, 1)",
                                      "a rate | or none (per step; paper: 0.1)")
    assert (kind.type, kind.default, kind.rule) == ("str", "`a`", "one of a, b")
    # not composed: the schema's own default
    assert (names.type, names.default, names.rule) == ("list of str", "`[x]`", "")
    assert sections[1].help == "the inner part"
    assert sections[1].keys == [docs_reference.Key("group.inner.depth", "int", "`3`", ">= 1", "how deep (layers)")]


def test_an_empty_string_default_is_written_as_yaml_writes_it():
    assert docs_reference.yaml_value("") == '""' and docs_reference.yaml_value(["", "a"]) == '["", a]'


def test_table_cells_escape_pipes_and_show_angle_brackets_outside_code():
    assert docs_reference.cell("a | b <c> `<d> e`\nf") == "a \\| b &lt;c&gt; `<d> e` f"


def test_every_group_and_key_of_the_schema_is_on_the_config_page():
    import typing

    from tokenpo.config import GROUPS, TrainConfig

    page = (REPO / "docs" / "reference" / "config.md").read_text()
    hints = typing.get_type_hints(TrainConfig)
    for group in GROUPS:
        assert f"## `{group}`" in page
        for part in docs_reference.schema_sections(hints[group], group, "", None):
            assert all(f"| `{key.key}` |" in page for key in part.keys)


def test_an_options_description_is_its_first_sentence_not_a_keys_comment(tmp_path):
    described = tmp_path / "a.yaml"
    described.write_text("# @package _global_\n# DAPO (arXiv 2503.14476), Eq. 6 read as one. More text\n# here.\n\n"
                         "# the key's comment\nkey: 1\n")
    assert docs_reference.first_comment(described) == "DAPO (arXiv 2503.14476), Eq. 6 read as one."
    undescribed = tmp_path / "b.yaml"
    undescribed.write_text("# the key's comment\nkey: 1\n")
    assert docs_reference.first_comment(undescribed) == ""


def test_the_comment_above_a_yaml_key(tmp_path):
    source = tmp_path / "train.yaml"
    source.write_text("# not this one\nx: 1\n\n# what seed is\n# in two lines\nseed: 7\nbare: 2\n")
    assert docs_reference.first_comment_above(source, "seed") == "what seed is in two lines"
    assert docs_reference.first_comment_above(source, "bare") == ""


def test_every_installed_command_and_module_command_is_documented():
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    modules = {command.module for command in docs_reference.COMMANDS}
    for target in scripts.values():
        module = target.split(":")[0]
        assert module in modules or module.rsplit(".", 1)[0] in modules, target
    packages = {path.parent.relative_to(REPO).as_posix().replace("/", ".")
                for path in (REPO / "tokenpo").rglob("__main__.py")}
    assert packages <= modules


@pytest.mark.parametrize("command", docs_reference.COMMANDS, ids=lambda c: c.invocation.split("  (")[0])
def test_each_command_has_its_section_on_the_cli_page(command):
    page = (REPO / "docs" / "reference" / "cli.md").read_text()
    assert f"## `{command.invocation.split('  (')[0]}`" in page


def test_a_quoted_plan_is_filled_from_the_plan_command():
    page = ("before\n<!-- output of: python -m tokenpo.plan model=tiny --device cpu -->\nstale\n<!-- end of output -->\n"
            "after\n")
    filled = docs_reference.with_plan_outputs(page)
    assert filled.startswith("before\n<!-- output of: python -m tokenpo.plan model=tiny --device cpu -->\n```text\n"
                             "planned for: cpu (--device)")
    assert "memory plan per process: tiny" in filled
    assert "stale" not in filled and filled.endswith("```\n<!-- end of output -->\nafter\n")
    assert str(REPO) not in filled


def test_the_memory_plans_behind_the_figure_are_current():
    import json

    spec = importlib.util.spec_from_file_location("docs_figures", REPO / "scripts" / "docs_figures.py")
    docs_figures = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(docs_figures)
    assert docs_figures.plans() == json.loads(docs_figures.PLANS.read_text()), \
        "docs/data/memory_plans.json is out of date: python scripts/docs_figures.py --plans"

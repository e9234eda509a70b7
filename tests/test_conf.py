"""The shipped config tree (conf/, the package resource tokenpo.conf): every key is commented, and a group option
that starts from another (`defaults: [base, _self_]`) writes only the keys it changes."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from support.flatten import flat
import tokenpo
from tokenpo import CONF_DIR

CONF = Path(CONF_DIR)
YAML_FILES = sorted(CONF.rglob("*.yaml"))


def written_lines(text: str) -> list[int]:
    """0-based numbers of the lines where a key or a list item is written first on its line (keys inside a
    one-line {..} or [..] share their parent's line, and its comment)."""
    lines = text.splitlines()
    found = set()

    def visit(node: yaml.Node) -> None:
        children = []
        if isinstance(node, yaml.MappingNode):
            children = [key for key, _ in node.value]
            for _, value in node.value:
                visit(value)
        elif isinstance(node, yaml.SequenceNode):
            children = node.value
            for item in node.value:
                visit(item)
        for child in children:
            mark = child.start_mark
            if lines[mark.line][:mark.column].strip() in ("", "-"):
                found.add(mark.line)

    root = yaml.compose(text)
    if root is not None:
        visit(root)
    return sorted(found)


def test_written_lines_finds_nested_keys_and_block_list_items_only():
    text = "a:\n  b: 1\n  c: [1, 2]\n  d: {e: 1}\nl:\n  - x\n  - y: 2\n    z: 3\n"
    assert written_lines(text) == [0, 1, 2, 3, 4, 5, 6, 7]
    assert written_lines("# only a comment\n") == []


def test_the_config_tree_is_inside_the_package():
    """CONF_DIR is what train, evaluate, preflight, bench and the tests compose from; a wheel carries it."""
    assert (CONF / "train.yaml").is_file()
    assert (Path(tokenpo.__file__).parent / "conf" / "train.yaml").resolve() == (CONF / "train.yaml").resolve()


@pytest.mark.parametrize("path", YAML_FILES, ids=lambda p: p.relative_to(CONF).as_posix())
def test_every_key_and_list_item_has_a_comment_above_it(path):
    text = path.read_text()
    lines = text.splitlines()
    missing = [f"conf/{path.relative_to(CONF).as_posix()}:{n + 1}: {lines[n].strip()!r}" for n in written_lines(text)
               if n == 0 or not lines[n - 1].lstrip().startswith("#")]
    assert not missing, "no comment on the line above:\n" + "\n".join(missing)


def base_options(path: Path) -> list[str]:
    """The options of its own group a group option starts from (its defaults list, less _self_)."""
    defaults = OmegaConf.load(path).get("defaults") or []
    return [entry for entry in defaults if isinstance(entry, str) and entry != "_self_"]


DELTAS = sorted((p.parent.name, p.stem, base) for p in CONF.glob("*/*.yaml") for base in base_options(p))


def test_deltas_are_found():
    assert {("algorithm", "dapo", "grpo"), ("eval", "aime25", "aime24"), ("deepspeed", "zero3_offload", "zero3"),
            ("model", "qwen2_5_32b", "qwen2_5_7b")} <= set(DELTAS)


@pytest.mark.parametrize(("group", "option", "base"), DELTAS, ids=lambda v: str(v))
def test_a_delta_writes_only_keys_it_changes(group, option, base):
    """A value equal to the base's is a copy: it would silently stop following the base."""
    written = OmegaConf.to_container(OmegaConf.load(CONF / group / f"{option}.yaml"))
    written.pop("defaults")
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        base_values = flat(OmegaConf.to_container(compose(f"{group}/{base}")[group]))
    copies = [key for key, value in flat(written).items() if key in base_values and base_values[key] == value]
    assert not copies, f"conf/{group}/{option}.yaml repeats {base}'s values of {copies}"

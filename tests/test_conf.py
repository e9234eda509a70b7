"""The shipped config tree (conf/, the package resource tokenpo.conf) against the typed config it fills: every key
names a dataclass field and is commented; in a group's default file (the option conf/train.yaml picks) the comment
above each key is the field's help (tokenpo.schema.setting) and the value its default; a group option that starts
from another (`defaults: [base, _self_]`) writes only the keys it changes."""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from support.flatten import flat
import tokenpo
from tokenpo import CONF_DIR
from tokenpo.config import GROUPS, TrainConfig
from tokenpo.data.config import DataConfig
from tokenpo.evaluation.config import EvalConfig
from tokenpo.logger.config import LoggerConfig
from tokenpo.schema import config_key
from tokenpo.models.config import LoraConfig, ModelConfig
from tokenpo.rollout.config import RolloutConfig
from tokenpo.schema import setting

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


# fields typed `dict` or `tuple` whose entries follow a config schema: a benchmark's data, the extra benchmarks
ENTRY_SCHEMAS = {(EvalConfig, "data"): DataConfig, (EvalConfig, "extra"): EvalConfig}
# sections whose values a group's default file takes from another file: (that file, the key it sits under there)
SECTION_FILES = {(ModelConfig, "lora"): ("model/lora/default.yaml", None),
                 (RolloutConfig, "vllm"): ("rollout/vllm.yaml", "vllm"),
                 (RolloutConfig, "server"): ("rollout/vllm_server.yaml", "server")}


def file_schema(path: Path) -> type | None:
    """The dataclass a conf file fills: its group's, the whole config's for experiments (`@package _global_`) and
    train.yaml; None for Hydra's own settings (conf/hydra)."""
    parts = path.relative_to(CONF).parts
    if parts[0] in GROUPS:
        return LoraConfig if parts[:2] == ("model", "lora") else typing.get_type_hints(TrainConfig)[parts[0]]
    return None if parts[0] == "hydra" else TrainConfig


def section_type(cls: type, name: str) -> type | None:
    """The dataclass the value of field `name` of `cls` follows (itself, or each of its entries), if any."""
    hint = typing.get_type_hints(cls)[name]
    return hint if dataclasses.is_dataclass(hint) else ENTRY_SCHEMAS.get((cls, name))


@dataclass
class Written:
    """A key as a conf file writes it."""

    key: str  # dotted, as in error messages: loss.clip_high, extra[0].data.loader
    owner: type  # the dataclass it belongs to
    spec: dataclasses.Field | None  # the field it names; None: no such field
    comment: str | None  # the comment lines right above it, joined; None inside a one-line {..}
    node: yaml.Node


def comment_above(lines: list[str], line: int) -> str:
    block = []
    while line > 0 and lines[line - 1].lstrip().startswith("#"):
        line -= 1
        block.insert(0, lines[line].lstrip()[1:].strip())
    return " ".join(block)


def written_keys(node: yaml.Node, cls: type, lines: list[str], prefix: str = "") -> list[Written]:
    """Each key under the mapping `node` (of the dataclass `cls`), recursing into sections and schema'd entries;
    Hydra's own keys (defaults, hydra) are not config fields."""
    found = []
    specs = {config_key(spec.name): spec for spec in dataclasses.fields(cls)}
    for key_node, value in node.value:
        name = key_node.value
        if name in ("defaults", "hydra") and not prefix:
            continue
        mark = key_node.start_mark
        own_line = lines[mark.line][:mark.column].strip() in ("", "-")
        spec = specs.get(name)
        found.append(Written(prefix + name, cls, spec, comment_above(lines, mark.line) if own_line else None, value))
        inner = section_type(cls, spec.name) if spec else None
        if inner and isinstance(value, yaml.MappingNode):
            found += written_keys(value, inner, lines, f"{prefix}{name}.")
        elif inner and isinstance(value, yaml.SequenceNode):
            for i, item in enumerate(value.value):
                if isinstance(item, yaml.MappingNode):
                    found += written_keys(item, inner, lines, f"{prefix}{name}[{i}].")
    return found


SCHEMA_FILES = [path for path in YAML_FILES if file_schema(path) is not None]


@pytest.mark.parametrize("path", SCHEMA_FILES, ids=lambda p: p.relative_to(CONF).as_posix())
def test_every_key_names_a_config_field(path):
    text = path.read_text()
    root = yaml.compose(text)
    unknown = [f"{w.key} ({w.owner.__name__})" for w in written_keys(root, file_schema(path), text.splitlines())
               if w.spec is None] if root is not None else []
    assert not unknown, f"conf/{path.relative_to(CONF).as_posix()} writes keys no dataclass declares: {unknown}"


def field_default(spec: dataclasses.Field) -> Any:
    value = spec.default_factory() if spec.default is dataclasses.MISSING else spec.default
    return list(value) if isinstance(value, tuple) else value


def disagreements(cls: type, text: str, under: str | None = None, prefix: str = "") -> list[str]:
    """Where the default file `text` (or its `under` section) and the dataclass `cls` say different things: a field
    not written, a comment that is not the field's help, a value that is not its default (unless the field says why:
    `shipped`)."""
    lines = text.splitlines()
    node = yaml.compose(text)
    if under is not None:
        node = next(value for key, value in node.value if key.value == under)
    values = OmegaConf.to_container(OmegaConf.create(text))
    values = values[under] if under is not None else values
    return _disagreements(cls, node, values, lines, prefix)


def _disagreements(cls: type, node: yaml.MappingNode, values: dict, lines: list[str], prefix: str) -> list[str]:
    found = []
    written = {w.key: w for w in written_keys(node, cls, lines) if "." not in w.key and "[" not in w.key}
    for spec in dataclasses.fields(cls):
        name = config_key(spec.name)
        key = prefix + name
        if name not in written:
            if (cls, spec.name) not in SECTION_FILES:
                found.append(f"{key}: not in the file")
            continue
        w = written[name]
        if w.comment is not None and w.comment != spec.metadata.get("help"):
            found.append(f"{key}: comment {w.comment!r} is not the field's help {spec.metadata.get('help')!r}")
        if dataclasses.is_dataclass(typing.get_type_hints(cls)[spec.name]):
            found += _disagreements(typing.get_type_hints(cls)[spec.name], w.node, values[name], lines, f"{key}.")
        elif values[name] != field_default(spec) and not spec.metadata.get("shipped"):
            found.append(f"{key}: value {values[name]!r} is not the default {field_default(spec)!r}")
    found += [f"{prefix}{w.key}: no such field" for w in written.values() if w.spec is None]
    return found


def default_options() -> dict[str, str]:
    """The option conf/train.yaml composes for each group: the group's default file."""
    entries = OmegaConf.load(CONF / "train.yaml").defaults
    return {group: option for entry in entries if isinstance(entry, dict) or OmegaConf.is_dict(entry)
            for group, option in entry.items() if group in GROUPS}


DEFAULT_FILES = sorted([(group, f"{group}/{option}.yaml", None) for group, option in default_options().items()]
                       + [(f"{cls.__name__}.{name}", file, under) for (cls, name), (file, under) in SECTION_FILES.items()])


def schema_of(label: str) -> type:
    if "." in label:
        cls, name = label.split(".")
        return typing.get_type_hints({c.__name__: c for c, _ in SECTION_FILES}[cls])[name]
    return typing.get_type_hints(TrainConfig)[label]


def test_every_group_and_composed_section_has_a_default_file():
    assert {label for label, _, _ in DEFAULT_FILES} == {*GROUPS, "ModelConfig.lora", "RolloutConfig.vllm",
                                                          "RolloutConfig.server"}
    assert ("trainer", "trainer/default.yaml", None) in DEFAULT_FILES


@pytest.mark.parametrize(("label", "file", "under"), DEFAULT_FILES, ids=[f for _, f, _ in DEFAULT_FILES])
def test_the_default_file_says_what_the_dataclass_says(label, file, under):
    """One source per key: the help and default of tokenpo/<group>/config.py, written out in the group's default
    file (comments may wrap over several lines; they are compared joined)."""
    found = disagreements(schema_of(label), (CONF / file).read_text(), under)
    assert not found, f"conf/{file} disagrees with {schema_of(label).__name__}:\n" + "\n".join(found)


@dataclass
class LoggerWithOtherHelp(LoggerConfig):
    project: str = setting("tokenpo", "Weights & Biases project")


@dataclass
class LoggerWithOtherDefault(LoggerConfig):
    project: str = setting("other", "W&B project")


def test_an_edit_to_one_side_alone_is_a_disagreement():
    text = (CONF / "logger" / "wandb.yaml").read_text()
    assert disagreements(LoggerConfig, text) == []
    comment = disagreements(LoggerConfig, text.replace("# W&B project\n", "# Weights & Biases project\n"))
    assert comment == ["project: comment 'Weights & Biases project' is not the field's help 'W&B project'"]
    assert disagreements(LoggerConfig, text.replace("project: tokenpo", "project: other")) == [
        "project: value 'other' is not the default 'tokenpo'"]
    assert disagreements(LoggerWithOtherHelp, text) == [
        "project: comment 'W&B project' is not the field's help 'Weights & Biases project'"]
    assert disagreements(LoggerWithOtherDefault, text) == ["project: value 'tokenpo' is not the default 'other'"]
    assert disagreements(LoggerConfig, text.replace("# W&B project\nproject: tokenpo\n", "")) == [
        "project: not in the file"]


def test_a_comment_may_wrap_and_a_one_line_mapping_shares_its_parents():
    text = "# Shape of the random model\n# (only used by source=tiny)\ntiny: {hidden_size: 64}\n"
    (tiny,) = [w for w in written_keys(yaml.compose(text), ModelConfig, text.splitlines()) if w.key == "tiny"]
    assert tiny.comment == "Shape of the random model (only used by source=tiny)"
    inner = [w for w in written_keys(yaml.compose(text), ModelConfig, text.splitlines()) if w.key != "tiny"]
    assert [(w.key, w.comment) for w in inner] == [("tiny.hidden_size", None)]


def test_every_config_field_has_help():
    """The help is the key's documentation; a field without it would have no comment to agree with."""
    missing, seen = [], set()

    def visit(cls: type, prefix: str) -> None:
        if cls in seen:
            return
        seen.add(cls)
        for spec in dataclasses.fields(cls):
            if not spec.metadata.get("help"):
                missing.append(f"{prefix}{spec.name} ({cls.__name__})")
            inner = section_type(cls, spec.name)
            if inner:
                visit(inner, f"{prefix}{spec.name}.")

    for group in GROUPS:
        visit(typing.get_type_hints(TrainConfig)[group], f"{group}.")
    assert not missing, f"fields without help: {missing}"

"""docs/architecture.md names only what exists: every path it puts in backticks is in the repository (a bare file
name somewhere in the package), every command's module or script exists, every config key's and code name's
identifiers are names in tokenpo's source, and every metric key is in the metrics registry."""

from __future__ import annotations

import io
import re
import tokenize
from functools import cache
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "architecture.md"
ROOTS = ("tokenpo/", "tests/", "docs/", "scripts/")
CONFIG_GROUPS = ("rollout", "trainer", "algorithm", "model", "data", "deepspeed", "eval", "reward", "logger")
# words the page puts in backticks that are not names of the code: the notation and the parameters it writes out
NOT_NAMES = {"k", "r", "N", "T", "P", "G", "b", "t", "n_row", "groups", "cfg", "rows", "mini_batch", "pad", "device",
             "micro", "split", "mini_batches", "world", "logp", "entropy", "loss", "tokens", "step", "lr", "run",
             "policy", "source", "entropy_coef", "health", "identity", "version", "published", "request", "key",
             "name", "prepared", "batch", "rollouts", "tokenizer", "rollout", "reference", "fill", "error",
             "keep_partial", "hf", "vllm", "with"}


@cache
def source_names() -> frozenset[str]:
    names = set()
    for path in (REPO / "tokenpo").rglob("*.py"):
        for token in tokenize.generate_tokens(io.StringIO(path.read_text()).readline):
            if token.type == tokenize.NAME:
                names.add(token.string)
    return frozenset(names)


@cache
def source_text() -> str:
    return "\n".join(path.read_text() for path in (REPO / "tokenpo").rglob("*.py"))


def quoted(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # code blocks: the drawing of the parts
    return re.findall(r"`([^`]+)`", text)


def path_exists(item: str) -> bool:
    path = item.split(":")[0]
    if path.startswith(ROOTS):
        return any(REPO.glob(path)) if "*" in path else (REPO / path).exists()
    if path.endswith("/"):  # a part of the package: trainer/
        return (REPO / "tokenpo" / path).is_dir()
    if re.fullmatch(r"[\w.]+\.py", path):  # a module named in its folder's row
        return any((REPO / "tokenpo").rglob(path))
    return f'"{path}"' in source_text() or f"'{path}'" in source_text()  # a file a run writes: summary.json


def problems(item: str) -> list[str]:
    """What `item` names that does not exist ([] when all of it does)."""
    if item.startswith("python -m "):
        module = item.split()[2].replace(".", "/")
        ok = (REPO / f"{module}.py").exists() or (REPO / module / "__main__.py").exists()
        return [] if ok else [item]
    if " " in item and item.split()[0].startswith(ROOTS):  # a script and its arguments
        return [] if (REPO / item.split()[0]).exists() else [item]
    if re.fullmatch(rf"({'|'.join(CONFIG_GROUPS)})\.[\w.]+( = .*|=.*)?", item):  # a config key
        last = re.split(r"\s*=", item)[0].split(".")[-1]
        return [] if last in source_names() else [item]
    if re.fullmatch(r"[a-z_]+/[\w*/]+", item) and not item.startswith(ROOTS) and "." not in item:
        if item.endswith("/"):
            return [] if path_exists(item) else [item]
        prefix = item.split("*")[0]  # a metric key: timing/*_s
        return [] if prefix in (REPO / "tokenpo" / "metrics_registry.py").read_text() or prefix in source_text() \
            else [item]
    if "/" in item or re.search(r"\.(py|md|json|jsonl|yaml)$", item):
        return [] if path_exists(item) else [item]
    return [name for name in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", item)
            if name not in NOT_NAMES and name not in source_names()]


def test_every_quoted_path_command_key_and_name_exists():
    missing = sorted({problem for item in quoted(PAGE) for problem in problems(item)})
    assert missing == []


def test_names_that_are_gone_are_found(tmp_path):
    page = tmp_path / "architecture.md"
    page.write_text("`sync_engine(engine, policy)`, `tokenpo/trainer/ahead.py`, `AheadSource.draw`, "
                    "`python -m tokenpo.trainer.health`, `rollout.async.no_such_key`, `timing/no_such_s`\n")
    assert sorted({p for item in quoted(page) for p in problems(item)}) == [
        "AheadSource", "python -m tokenpo.trainer.health", "rollout.async.no_such_key", "sync_engine",
        "timing/no_such_s", "tokenpo/trainer/ahead.py"]

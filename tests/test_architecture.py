"""The seams docs/architecture.md describes, held by the code: no import cycle between tokenpo's top-level parts; the
training path names LoRA in two modules (the policy and its checkpoint format) and decides "ZeRO-3?" in one
(tokenpo.deepspeed.config); the trainer never tests what kind of generator or source it holds; functions of the
trainer, the rollout engines and the models stay small (at most 60 lines and 8 parameters)."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "tokenpo"
TRAINING_PATH = ("trainer", "deepspeed", "rollout", "algorithms")
MAX_LINES, MAX_PARAMETERS = 60, 8


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(path): path for path in PACKAGE.rglob("*.py")}


def imported(nodes) -> set[str]:
    """What the imports among `nodes` name of tokenpo: `module.name` for `from module import name`, the module for
    `import module`."""
    found = set()
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("tokenpo"):
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith("tokenpo"))
    return found


def runtime_imports(path: Path, known: set[str]) -> set[str]:
    """The tokenpo modules `path` imports when it is imported: its module-level imports (not those under
    `if TYPE_CHECKING:`, nor those inside functions, which run when called); a name imported from a module counts as
    that module unless it is a module itself."""
    names = imported(ast.parse(path.read_text()).body)
    return {name if name in known else name.rpartition(".")[0] for name in names} & known


def part(module: str) -> str:
    """tokenpo.trainer.core.step -> trainer; tokenpo.config -> config."""
    return module.split(".")[1] if "." in module else module


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph.get(node, ())):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def part_graph() -> dict[str, set[str]]:
    known = modules()
    graph: dict[str, set[str]] = {}
    for name, path in known.items():
        for imported in runtime_imports(path, set(known)):
            if part(imported) != part(name):
                graph.setdefault(part(name), set()).add(part(imported))
    return graph


def code_tokens(path: Path) -> str:
    """The module's code without comments and docstrings: names and strings only."""
    tree = ast.parse(path.read_text())
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)
                  and isinstance(node.body[0].value.value, str)}
    doc_lines = {line for node in ast.walk(tree) if id(node) in docstrings
                 for line in range(node.lineno, node.end_lineno + 1)}
    kept = [token.string for token in tokenize.generate_tokens(io.StringIO(path.read_text()).readline)
            if token.type in (tokenize.NAME, tokenize.STRING) and token.start[0] not in doc_lines]
    return " ".join(kept)


def training_path_modules() -> list[Path]:
    return sorted(path for folder in TRAINING_PATH for path in (PACKAGE / folder).rglob("*.py"))


def test_no_import_cycle_between_top_level_parts():
    assert cycles(part_graph()) == []


def test_the_cycle_check_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


LAYERS = ("core", "harness", "processes")  # tokenpo.trainer's, each importing only those before it


def imports_anywhere(path: Path) -> set[str]:
    """Every tokenpo module or name `path` imports, wherever the import is."""
    return imported(ast.walk(ast.parse(path.read_text())))


def layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[:2] == ["tokenpo", "trainer"] and parts[2] in LAYERS else None


def test_the_trainers_layers_import_only_those_below():
    for name, path in modules().items():
        if (own := layer(name)) is None:
            continue
        above = LAYERS[LAYERS.index(own) + 1:]
        wrong = sorted(m for m in imports_anywhere(path) if layer(m) in above)
        assert wrong == [], f"{name} ({own}) imports {wrong}"


# the benchmark times the backward and the optimizer step inside the step core, which it patches for that
INSTRUMENTS = {"tokenpo.bench.run_tokenpo"}


def test_other_packages_import_the_trainer_through_its_facade():
    for name, path in modules().items():
        if name.startswith("tokenpo.trainer") or name in INSTRUMENTS:
            continue
        wrong = sorted(m for m in imports_anywhere(path) if layer(m) is not None)
        assert wrong == [], f"{name} imports {wrong}: import them from tokenpo.trainer"


def test_the_facade_names_resolve():
    import tokenpo.trainer as trainer

    for name in trainer.PUBLIC:
        assert getattr(trainer, name) is not None, name


def test_the_training_path_names_lora_in_two_modules():
    naming = [path.relative_to(REPO).as_posix() for path in training_path_modules()
              if re.search(r"lora|peft", code_tokens(path), re.I)]
    assert naming == ["tokenpo/trainer/core/policy.py", "tokenpo/trainer/harness/checkpoint.py"]


def test_zero3_is_decided_in_one_module():
    deciding = [path.relative_to(REPO).as_posix() for path in PACKAGE.rglob("*.py")
                if path.parent.name != "plan"  # the planner sizes every stage, it decides none
                and re.search(r"stage\s*[!=]=\s*3|zero_optimization_stage\(\)\s*[!=]=", path.read_text())]
    assert deciding == ["tokenpo/deepspeed/config.py"]


def test_the_trainer_tests_no_kind_of_generator_source_or_engine():
    for path in (PACKAGE / "trainer").rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance":
                kind = ast.unparse(node.args[1])
                assert not re.search(r"Source|Engine|Generator", kind), f"{path.name}: isinstance(..., {kind})"
        assert "tokenpo.rollout.hf" not in path.read_text() and "tokenpo.rollout.vllm" not in path.read_text(), path


def parameters(function: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    args = function.args
    count = len(args.posonlyargs) + len(args.args) + len(args.kwonlyargs) + bool(args.vararg) + bool(args.kwarg)
    return count - (1 if args.args and args.args[0].arg in ("self", "cls") else 0)


@pytest.mark.parametrize("folder", ["trainer", "rollout", "models"])
def test_functions_are_small(folder):
    large = []
    for path in sorted((PACKAGE / folder).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_LINES or parameters(node) > MAX_PARAMETERS:
                    large.append(f"{path.name}:{node.name} ({lines} lines, {parameters(node)} parameters)")
    assert large == []

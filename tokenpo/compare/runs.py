"""Find tokenpo run dirs, load their metrics.jsonl and Hydra overrides, and group runs across seeds."""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from tokenpo.errors import ConfigError
from tokenpo.trainer import ENVIRONMENT_FILE, LIBRARIES, read_environments

METRICS_FILE = "metrics.jsonl"
OVERRIDES_FILE = os.path.join(".hydra", "overrides.yaml")
# label of the single group when no override tells the runs apart
ALL_RUNS = "all runs"


@dataclass
class Run:
    path: Path
    # override key -> value as written on the command line, e.g. {"algorithm": "gtpo", "seed": "1"}
    overrides: dict[str, str]
    # one dict per logged step, sorted by step; a step logged twice (resumed run) keeps its last line
    records: list[dict[str, float]]
    # one-line notes on what was skipped or is missing, for the report
    problems: list[str] = field(default_factory=list)
    # the numerics environment of each start (environment.json); empty for runs from before tokenpo recorded it
    environments: list[dict] = field(default_factory=list)


def is_run_dir(path: Path) -> bool:
    return (path / METRICS_FILE).is_file() or (path / OVERRIDES_FILE).is_file()


def discover_run_dirs(inputs: list[Path]) -> list[Path]:
    """Run dirs at or below each input, in input order; a dir reached twice is listed once."""
    found: dict[Path, Path] = {}
    for root in inputs:
        if not root.is_dir():
            raise FileNotFoundError(f"no such directory: {root}")
        for dirpath, dirnames, _ in os.walk(root):
            here = Path(dirpath)
            if is_run_dir(here):
                found.setdefault(here.resolve(), here)
                # a run dir's subdirs (checkpoints, .hydra) hold no further runs
                dirnames.clear()
            else:
                dirnames[:] = sorted(name for name in dirnames if not name.startswith("."))
    return list(found.values())


def parse_overrides(items: list[str]) -> dict[str, str]:
    """Hydra override strings -> {key: value}; '+'/'++' prefixes (append/force) do not change the key."""
    parsed = {}
    for item in items:
        key, _, value = str(item).partition("=")
        parsed[key.lstrip("+")] = value
    return parsed


def load_overrides(run_dir: Path) -> tuple[dict[str, str], list[str]]:
    path = run_dir / OVERRIDES_FILE
    # a run dir without Hydra files groups with the other override-less runs
    if not path.is_file():
        return {}, []
    try:
        items = yaml.safe_load(path.read_text()) or []
    except yaml.YAMLError as err:
        first_line = str(err).splitlines()[0]
        return {}, [f"run {run_dir}: unreadable {OVERRIDES_FILE} ({first_line}); treated as no overrides"]
    if not isinstance(items, list):
        return {}, [f"run {run_dir}: {OVERRIDES_FILE} is not a YAML list; treated as no overrides"]
    return parse_overrides(items), []


def is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def load_metrics(run_dir: Path) -> tuple[list[dict[str, float]], list[str]]:
    path = run_dir / METRICS_FILE
    if not path.is_file():
        return [], [f"run {run_dir}: no metrics.jsonl yet"]
    by_step: dict[int, dict[str, float]] = {}
    bad_lines = bad_values = 0
    with path.open(encoding="utf-8", errors="replace") as lines:
        for line in lines:
            if not line.strip():
                continue
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:
                bad_lines += 1
                continue
            if not isinstance(entry, dict) or not isinstance(entry.get("step"), int):
                bad_lines += 1
                continue
            record = {key: float(value) for key, value in entry.items() if is_number(value)}
            bad_values += len(entry) - len(record)
            by_step[entry["step"]] = record
    problems = []
    if bad_lines:
        problems.append(
            f"run {run_dir}: skipped {bad_lines} unreadable line(s) of metrics.jsonl "
            "(truncated, or not a JSON object with an int step)"
        )
    if bad_values:
        problems.append(f"run {run_dir}: skipped {bad_values} non-numeric or non-finite value(s)")
    if not by_step:
        problems.append(f"run {run_dir}: no metrics in metrics.jsonl yet")
    return [by_step[step] for step in sorted(by_step)], problems


def load_run(run_dir: Path) -> Run:
    overrides, override_problems = load_overrides(run_dir)
    records, metric_problems = load_metrics(run_dir)
    problems = override_problems + metric_problems
    environments = read_environments(run_dir)
    if environments is None:
        problems.append(f"run {run_dir}: unreadable {ENVIRONMENT_FILE}; its environment is not shown")
    return Run(run_dir, overrides, records, problems, environments or [])


def environment_label(start: dict) -> str:
    """One start's environment in a line: what must match for its numbers to reproduce."""
    libraries = ", ".join(f"{name} {start[name]}" for name in LIBRARIES if name in start)
    return (f"{start.get('device', '?')} ({start.get('cpu_capability', '?')}), {start.get('threads', '?')} thread(s) "
            f"x {start.get('processes', '?')} process(es), {libraries}")


def environment_lines(groups: dict[str, list[Run]]) -> list[str]:
    """Where the compared runs were measured: one line per environment with its run count, a warning when there is
    more than one (the same config and seed reproduce only within one), and the runs that recorded none."""
    runs_in: dict[str, list[str]] = {}
    unrecorded = 0
    for label, runs in groups.items():
        for run in runs:
            if not run.environments:
                unrecorded += 1
            for environment in dict.fromkeys(environment_label(start) for start in run.environments):
                runs_in.setdefault(environment, []).append(label)
    lines = []
    if len(runs_in) > 1:
        lines.append(f"The runs were measured in {len(runs_in)} environments; a config and seed give the same numbers "
                     "only within one (a run resumed elsewhere counts in each):")
    for environment, labels in sorted(runs_in.items()):
        named = ", ".join(dict.fromkeys(labels))
        lines.append(f"- {environment}: {len(labels)} run(s)" + (f" ({named})" if len(runs_in) > 1 else ""))
    if unrecorded:
        lines.append(f"- {unrecorded} run(s) without {ENVIRONMENT_FILE} (from before tokenpo recorded it)")
    return lines


def is_averaged(key: str, average_over: list[str]) -> bool:
    """'seed' also matches nested seeds such as 'data.seed'."""
    return any(key == name or key.endswith("." + name) for name in average_over)


def label_keys(runs: list[Run], average_over: list[str], group_by: list[str] | None) -> list[str]:
    """Keys that name a group: --group-by keys as given, else every override key that varies across
    runs and is not averaged over, in the order the overrides first list them."""
    if group_by:
        known = {key for run in runs for key in run.overrides}
        unknown = [key for key in group_by if key not in known]
        if unknown:
            raise ConfigError(f"--group-by {unknown[0]}: no run overrides it; overridden keys: {', '.join(sorted(known))}")
        return list(group_by)
    keys = dict.fromkeys(key for run in runs for key in run.overrides)
    return [
        key for key in keys
        if not is_averaged(key, average_over) and len({run.overrides.get(key) for run in runs}) > 1
    ]


def group_runs(runs: list[Run], average_over: list[str], group_by: list[str] | None = None) -> dict[str, list[Run]]:
    """{label: runs}, sorted by label; a label reads like 'algorithm=dapo'. A key a run does not set is left out of
    its label ('experiment=gtpo/alpha2_0_control' beside 'algorithm=dapo'): the keys it does set tell it apart."""
    keys = label_keys(runs, average_over, group_by)
    groups: dict[str, list[Run]] = {}
    for run in runs:
        label = " ".join(f"{key}={run.overrides[key]}" for key in keys if key in run.overrides) or ALL_RUNS
        groups.setdefault(label, []).append(run)
    return dict(sorted(groups.items()))


def same_value(a: str | None, b: str) -> bool:
    """Override values match as text, or as numbers (Hydra writes 2e-5 as 2e-05)."""
    if a == b:
        return True
    try:
        return a is not None and float(a) == float(b)
    except ValueError:
        return False


def matching_groups(groups: dict[str, list[Run]], selector: str) -> list[str]:
    """The groups whose runs all carry the selector's overrides, e.g. 'algorithm=grpo' ('a=1 b=2': both)."""
    wanted = parse_overrides(selector.split())
    return [label for label, runs in groups.items()
            if all(same_value(run.overrides.get(key), value) for run in runs for key, value in wanted.items())]


def select_groups(groups: dict[str, list[Run]], selectors: list[str], keep: str | None) -> dict[str, list[Run]]:
    """The groups any of `selectors` matches (matching_groups), and `keep` (the baseline) whatever they say; a selector
    that matches no group is a one-line error listing the groups."""
    chosen = set() if keep is None else {keep}
    for selector in selectors:
        matches = matching_groups(groups, selector)
        if not matches:
            raise ConfigError(f"--select {selector!r} matches no group; groups: {' | '.join(groups)}")
        chosen.update(matches)
    return {label: runs for label, runs in groups.items() if label in chosen}


def find_group(groups: dict[str, list[Run]], selector: str) -> str:
    """The one group whose runs all carry the selector's overrides, e.g. 'algorithm=grpo'."""
    matches = matching_groups(groups, selector)
    if len(matches) != 1:
        raise ConfigError(
            f"--baseline {selector!r} matches {len(matches)} groups, need exactly 1; groups: {' | '.join(groups)}"
        )
    return matches[0]


def missing_metric_notes(groups: dict[str, list[Run]], keys: list[str]) -> list[str]:
    """One line per metric that no run logs, or that a whole group lacks."""
    notes = []
    for key in keys:
        lacking = [label for label, runs in groups.items() if not any(key in r for run in runs for r in run.records)]
        if len(lacking) == len(groups):
            notes.append(f"metric {key}: logged by no run")
        else:
            notes.extend(f"group {label}: no {key} values" for label in lacking)
    return notes

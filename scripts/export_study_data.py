"""The per-run data behind a study's tables, one CSV row per run, so the docs' numbers can be recomputed.

    .venv/bin/python scripts/export_study_data.py export outputs/study --out docs/data/study.csv
    .venv/bin/python scripts/export_study_data.py export outputs/study_long --out docs/data/study_long.csv --every-eval
    .venv/bin/python scripts/export_study_data.py table docs/data/study.csv --baseline algorithm=grpo

`table` prints a CSV's table the way the docs quote it: per group n, mean ± sample std [95 % Student-t interval],
and the paired difference to the baseline over the same seeds [95 % interval], two-sided p and Holm's p.

Each row: the run's group (its overrides minus `seed`, as `tokenpo.compare` labels it), its seed, and the last
logged value of each column's metric (held-out and transfer accuracy, entropy, KL, response length, generated
tokens, clipped tokens, elapsed seconds, staleness, sampler KL, capped behaviour weights, the entropy methods'
selected/kept/clipped fractions, covariance mean, gate and coefficient); `--every-eval` writes
one row per evaluated step instead (curves).
A metric a run never logged is left empty. The group means, stds and paired tests of `tokenpo.compare` follow
from these rows (docs/data/README.md says which page uses which file).
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from tokenpo.compare.runs import Run, discover_run_dirs, group_runs, load_run
from tokenpo.compare.significance import holm_adjust, paired_t_test
from tokenpo.compare.stats import mean_and_ci95, mean_and_std

# CSV column -> metrics.jsonl key; the eval keys are logged only on evaluated steps
COLUMNS = {
    "held_out": "eval/accuracy",
    "transfer": "eval/arith_transfer/accuracy",
    "entropy": "entropy/mean",
    "kl_ref": "kl/ref",
    "response_length": "response_length/mean",
    "generated_tokens": "tokens/generated_total",
    "clip_low_frac": "clip/low_frac",
    "clip_high_frac": "clip/high_frac",
    "elapsed_s": "time/elapsed_s",
    # generation ahead of the update (rollout.async.*): mean staleness, sampler/trainer KL, behaviour-weight cap
    "staleness": "async/staleness",
    "sampler_kl": "mismatch/kl",
    "tis_capped_frac": "tis/capped_frac",
    # what the entropy methods' papers plot (docs/algorithms.md): tokens selected, kept or clipped, the covariance
    # mean, the soft gate, the adaptive coefficient, TEPO's mask
    "cov_mean": "cov/mean",
    "clip_cov_selected_frac": "clip_cov/selected_frac",
    "kl_cov_selected_frac": "kl_cov/selected_frac",
    "entropy_top_kept_frac": "entropy_top/kept_frac",
    "cispo_clipped_frac": "cispo/clipped_frac",
    "gmpo_clip_low_frac": "gmpo/clip_low_frac",
    "gmpo_clip_high_frac": "gmpo/clip_high_frac",
    "sapo_gate_mean": "sapo/gate_mean",
    "entropy_coef": "entropy/coef",
    "tepo_mask_frac": "tepo/mask_frac",
}
EVAL_KEY = COLUMNS["held_out"]


@dataclass
class RunRow:
    group: str
    seed: str
    step: int
    # CSV column -> value, None where the run did not log it
    values: dict[str, float | None]


def final_eval_metrics(run_dir: Path) -> dict[str, float]:
    """The after-training evaluation's scores (eval_after.json and one eval_after.<bench>.json per extra set):
    a run whose last step was not an eval step logs them there only."""
    metrics: dict[str, float] = {}
    for path in sorted(run_dir.glob("eval_after*.json")):
        metrics.update(json.loads(path.read_text()).get("metrics", {}))
    return metrics


def last_values(run: Run) -> dict[str, float | None]:
    """Each column's last logged value: a run's final evaluation and its last step's training metrics."""
    values: dict[str, float | None] = {column: None for column in COLUMNS}
    for record in [*run.records, final_eval_metrics(run.path)]:
        for column, key in COLUMNS.items():
            if key in record:
                values[column] = record[key]
    return values


def final_row(group: str, run: Run) -> RunRow:
    last_step = int(run.records[-1]["step"]) if run.records else 0
    return RunRow(group, run.overrides.get("seed", ""), last_step, last_values(run))


def eval_rows(group: str, run: Run) -> list[RunRow]:
    """One row per evaluated step; the training columns are that step's (empty at step 0, before training)."""
    return [
        RunRow(group, run.overrides.get("seed", ""), int(record["step"]),
               {column: record.get(key) for column, key in COLUMNS.items()})
        for record in run.records if EVAL_KEY in record
    ]


def study_rows(inputs: list[Path], every_eval: bool) -> list[RunRow]:
    runs = [load_run(path) for path in discover_run_dirs(inputs)]
    rows: list[RunRow] = []
    for group, members in group_runs(runs, ["seed"]).items():
        for run in sorted(members, key=lambda run: run.overrides.get("seed", "")):
            rows.extend(eval_rows(group, run) if every_eval else [final_row(group, run)])
    return rows


def cell(value: float | None) -> str:
    # repr keeps every digit, so a recomputed mean equals compare's to the last bit
    return "" if value is None else repr(value)


def write_csv(rows: list[RunRow], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["group", "seed", "step", *COLUMNS])
        for row in rows:
            writer.writerow([row.group, row.seed, row.step, *(cell(row.values[column]) for column in COLUMNS)])


def read_column(path: Path, column: str) -> dict[str, dict[str, float]]:
    """{group: {seed: value}} of one column, the rows that have it; a group's last row per seed wins."""
    values: dict[str, dict[str, float]] = {}
    with path.open(newline="") as handle:
        for row in csv.DictReader(handle):
            if row.get(column):
                values.setdefault(row["group"], {})[row["seed"]] = float(row[column])
    return values


def table_lines(values: dict[str, dict[str, float]], baseline: str) -> list[str]:
    """One line per group; the others are tested against the baseline on the seeds both ran, Holm over them."""
    others = [group for group in values if group != baseline]
    tests = {}
    for group in others:
        seeds = sorted(set(values[group]) & set(values[baseline]))
        tests[group] = paired_t_test([values[group][s] for s in seeds], [values[baseline][s] for s in seeds])
    tested = [group for group in others if tests[group]]
    holm = dict(zip(tested, holm_adjust([tests[group].p for group in tested])))
    lines = []
    for group, by_seed in values.items():
        mean, std = mean_and_std(list(by_seed.values()))
        _, low, high = mean_and_ci95(list(by_seed.values()))
        line = f"{group}: n={len(by_seed)} {mean:.3f} ± {std:.3f}"
        line += f" [{low:.3f}, {high:.3f}]" if low is not None else ""
        if test := tests.get(group):
            line += (f"; - {baseline}: {test.difference:+.3f} [{test.ci_low:+.3f}, {test.ci_high:+.3f}], "
                     f"{test.name}, p = {test.p:.3f}, Holm {holm[group]:.3f}")
        lines.append(line)
    return lines


def export(args: argparse.Namespace) -> int:
    rows = study_rows(args.inputs, args.every_eval)
    if not rows:
        print(f"no runs with metrics under {', '.join(map(str, args.inputs))}", file=sys.stderr)
        return 1
    write_csv(rows, args.out)
    print(f"{len(rows)} rows -> {args.out}")
    return 0


def table(args: argparse.Namespace) -> int:
    values = read_column(args.csv, args.column)
    if args.baseline not in values:
        print(f"--baseline {args.baseline!r} is not a group of {args.csv} (groups: {', '.join(values)})",
              file=sys.stderr)
        return 1
    print("\n".join(table_lines(values, args.baseline)))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    to_csv = commands.add_parser("export", help="run dirs -> one CSV row per run (or per evaluated step)")
    to_csv.add_argument("inputs", nargs="+", type=Path, help="study folders (run dirs at or below them)")
    to_csv.add_argument("--out", type=Path, required=True, help="CSV to write, e.g. docs/data/study.csv")
    to_csv.add_argument("--every-eval", action="store_true", help="one row per evaluated step, not per run")
    to_csv.set_defaults(run=export)
    summary = commands.add_parser("table", help="a CSV's per-group means and paired tests against a baseline")
    summary.add_argument("csv", type=Path)
    summary.add_argument("--baseline", required=True, help="a group of the CSV, e.g. algorithm=grpo")
    summary.add_argument("--column", default="held_out", help="the value to summarise (a column of the CSV)")
    summary.set_defaults(run=table)
    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())

"""tokenpo-compare: figures and a summary table from a Hydra multirun (or run dirs) of tokenpo trainings."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tokenpo.compare.curve_report import compare_curves
from tokenpo.compare.plots import (
    EVAL_KEY, FIGURES, LAYOUTS, OVERLAY_MAX_GROUPS, TIME_KEY, TOKENS_KEY, X_KEYS, plot_all,
)
from tokenpo.compare.runs import (
    discover_run_dirs, environment_lines, find_group, group_runs, load_run, missing_metric_notes, select_groups,
)
from tokenpo.compare.significance import RUN_VALUE, compare_to_baseline, significance_markdown, write_significance_csv
from tokenpo.compare.stats import BANDS
from tokenpo.compare.table import markdown_report, summarize_group, with_baseline_ratios, write_csv
from tokenpo.compare.wandb_log import log_comparison
from tokenpo.errors import ConfigError

# where results go without --out: under the current directory, as tokenpo.train's outputs/runs
OUTPUT_ROOT = Path("outputs/compare")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="tokenpo-compare",
        description="Compare tokenpo training runs: one PNG per metric against step, wall-clock time and generated "
        "tokens, a summary table (summary.md, summary.csv) and, with --baseline, significance tests against it "
        "(significance.md, significance.csv). Runs are grouped by their Hydra overrides minus the averaged-over "
        "keys; keys equal in every run are left out of group labels.",
    )
    parser.add_argument("inputs", nargs="+", type=Path, help="Hydra multirun dirs and/or run dirs (searched recursively)")
    parser.add_argument("--out", type=Path, help=f"output dir (default: {OUTPUT_ROOT}/<first input's name> under the "
                                                 "current directory, outside the compared runs)")
    parser.add_argument(
        "--select", action="append", metavar="OVERRIDES",
        help="compare only the groups these overrides pick, e.g. 'algorithm=dapo' ('a=1 b=2': both); repeatable, a "
        "group any of them picks is kept; the --baseline group always is (default: every group)",
    )
    parser.add_argument(
        "--layout", choices=LAYOUTS, default="auto",
        help=f"overlay: every group on one axes; grid: small multiples, a panel per group with the others' means in "
        f"grey; auto: grid above {OVERLAY_MAX_GROUPS} groups (default: auto)",
    )
    parser.add_argument(
        "--average-over", action="append", metavar="KEY",
        help="override key averaged over within a group, also matching nested '*.KEY'; repeatable (default: seed)",
    )
    parser.add_argument(
        "--group-by", action="append", metavar="KEY",
        help="group only by these override keys (kept in labels even when equal in every run); repeatable",
    )
    parser.add_argument(
        "--band", choices=BANDS.names(), default="std",
        help="band around the mean: std = mean ± sample std (ddof=1; zero width for one run), "
        "minmax = envelope of the runs, more honest with 2-3 seeds, ci = 95%% Student-t interval of the mean "
        "(none where one run logged the step) (default: std)",
    )
    parser.add_argument(
        "--target-metric", default=EVAL_KEY,
        help=f"metric for final/best values, their significance tests and steps/time/tokens-to-target (default: {EVAL_KEY})",
    )
    parser.add_argument("--target", type=float, default=0.5, help="a run reaches the target at its first step with metric >= this (default: 0.5)")
    parser.add_argument(
        "--baseline", metavar="OVERRIDES",
        help="group the ratios and significance tests are taken against, e.g. 'algorithm=grpo'",
    )
    parser.add_argument(
        "--margin", type=float, metavar="M",
        help="equivalence margin in the target metric's units, named before the runs (e.g. 0.05): a group is "
        "'equivalent' to the baseline when the 95%% interval of the difference lies inside ±M",
    )
    parser.add_argument(
        "--fit-curves", action="store_true",
        help="also fit ScaleRL's saturating curve R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B) (arXiv 2510.13786, "
        "Eq. 1) to each run's --fit-metric against --compute, with per-group t-intervals over seeds, the C_mid ratio "
        "to --baseline and the compute to --target, and one curve per group pooled over its seeds with seed-resampling "
        "intervals (curves.md, curves.csv, curve_fits.csv, curves_pooled.csv, curves_vs_<compute>.png)",
    )
    parser.add_argument(
        "--compute", choices=sorted(X_KEYS),
        help=f"compute axis of the fits: tokens = {TOKENS_KEY}, time = {TIME_KEY} (default: tokens; needs --fit-curves)",
    )
    parser.add_argument(
        "--fit-from", type=float, metavar="C",
        help="fit only points with compute > C, in --compute units; ScaleRL leaves out its first ~1.5k GPU-hours "
        "(Sec. 2.1), which has no tokens equivalent (default: 0, every point; needs --fit-curves)",
    )
    parser.add_argument(
        "--fit-metric", action="append", metavar="KEY",
        help="metric to fit, a rate in [0, 1], one figure panel each; repeatable (default: --target-metric; "
        "needs --fit-curves)",
    )
    parser.add_argument("--no-figures", action="store_true",
                        help="tables only (e.g. a second target metric of runs whose figures are written already)")
    parser.add_argument("--wandb", action="store_true", help="also log figures and table to one W&B run (honours WANDB_MODE)")
    parser.add_argument("--wandb-project", default="tokenpo", help="W&B project (default: tokenpo)")
    args = parser.parse_intermixed_args(argv)  # run folders before, between or after the options
    if args.margin is not None and not args.margin > 0:
        parser.error(f"--margin must be > 0 (in the units of {args.target_metric}), got {args.margin:g}")
    if args.margin is not None and not args.baseline:
        parser.error("--margin needs --baseline: the margin is on the difference to the baseline")
    fit_options = [name for name, value in (("--compute", args.compute), ("--fit-from", args.fit_from),
                                            ("--fit-metric", args.fit_metric)) if value is not None]
    if fit_options and not args.fit_curves:
        parser.error(f"{fit_options[0]} needs --fit-curves")
    if args.fit_from is not None and not args.fit_from >= 0:
        parser.error(f"--fit-from must be >= 0 (in --compute units), got {args.fit_from:g}")
    return args


def compare(args: argparse.Namespace) -> None:
    run_dirs = discover_run_dirs(args.inputs)
    if not run_dirs:
        raise FileNotFoundError(
            f"no run dirs (with metrics.jsonl or .hydra/overrides.yaml) under {' '.join(map(str, args.inputs))}"
        )
    runs = [load_run(run_dir) for run_dir in run_dirs]
    notes = [problem for run in runs for problem in run.problems]
    with_metrics = [run for run in runs if run.records]
    if not with_metrics:
        raise FileNotFoundError(f"none of the {len(runs)} run dirs has metrics yet")
    groups = group_runs(with_metrics, args.average_over or ["seed"], args.group_by)
    baseline = find_group(groups, args.baseline) if args.baseline else None
    if args.select:
        groups = select_groups(groups, args.select, baseline)

    out_dir = args.out or default_out_dir(args.inputs[0])
    out_dir.mkdir(parents=True, exist_ok=True)
    figures = [] if args.no_figures else plot_all(groups, args.band, out_dir, args.layout)
    summaries = [summarize_group(label, group, args.target_metric, args.target) for label, group in groups.items()]
    if baseline:
        summaries = with_baseline_ratios(summaries, baseline)
    metric_keys = list(dict.fromkeys([
        *(key for spec in FIGURES for key in spec.panels), TIME_KEY, TOKENS_KEY, args.target_metric,
    ]))
    notes += missing_metric_notes(groups, metric_keys)

    write_csv(summaries, out_dir / "summary.csv")
    significance, written = "", "summary.md and summary.csv"
    if baseline:
        tables = {which: compare_to_baseline(groups, baseline, args.target_metric, which, args.margin)
                  for which in RUN_VALUE}
        significance = significance_markdown(tables, args.target_metric, baseline)
        (out_dir / "significance.md").write_text(significance)
        write_significance_csv(tables, args.target_metric, baseline, out_dir / "significance.csv")
        written = "summary.md/.csv and significance.md/.csv"
    report = markdown_report(
        summaries, notes, args.target_metric, args.target, baseline, significance, environment_lines(groups)
    )
    (out_dir / "summary.md").write_text(report)
    print(report, end="")
    if args.fit_curves:
        curves, curve_files = compare_curves(
            groups, args.fit_metric or [args.target_metric], args.compute or "tokens", args.fit_from or 0.0, baseline,
            args.target_metric, args.target, args.band, out_dir, not args.no_figures,
        )
        print(f"\n## Curve fits\n\n{curves}", end="")
        figures += [path for path in curve_files if path.suffix == ".png"]
        written += ", " + ", ".join(path.name for path in curve_files)
    print(f"wrote {len(figures)} figures, {written} to {out_dir}")
    if args.wandb:
        log_comparison(figures, summaries, args.wandb_project, args.inputs[0].resolve().name)


def default_out_dir(first_input: Path) -> Path:
    """outputs/compare/<the first input's name> under the current directory: never inside the compared runs (which
    may be committed data)."""
    return Path.cwd() / OUTPUT_ROOT / first_input.resolve().name


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        compare(args)
    except (ConfigError, FileNotFoundError) as err:
        print(f"tokenpo-compare: {err}", file=sys.stderr)
        return 1
    return 0

"""The curve fits' report: per metric a table of the per-seed fits summarised per group (tokenpo.compare.curves),
a table of the fits pooled over seeds (tokenpo.compare.pooled), every run's fit, their CSVs and one figure."""

from __future__ import annotations

import csv
import dataclasses
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from tokenpo.compare.curves import (
    B_BOUNDS,
    C_MID_BEYOND,
    FLAT_ALPHA,
    N_PARAMS,
    RATE_MAX,
    START_B,
    START_C_MID_POINTS,
    CMidRatio,
    CurveFit,
    GroupCurves,
    Interval,
    TargetReach,
    fit_groups,
    saturating_curve,
    seeds_to_tell,
    speed_verdict,
)
from tokenpo.compare.plots import X_AXES, X_KEYS, axis_label, draw_group, group_colours
from tokenpo.compare.pooled import MIN_FITTED_SHARE, PooledGroup, pool_groups
from tokenpo.compare.runs import Run
from tokenpo.compare.stats import reduce_band

# points on the log-compute grid the fitted curves are drawn at
CURVE_POINTS = 100


def fmt_interval(interval: Interval | None, digits: str) -> str:
    if interval is None:
        return "—"
    shown = f"{interval.mean:{digits}}"
    return shown + (" [n/a: 1 fit]" if interval.low is None else f" [{interval.low:{digits}}, {interval.high:{digits}}]")


def fmt_ratio(ratio: CMidRatio | None) -> str:
    if ratio is None:
        return "—"
    if ratio.ratio is None:
        return ratio.test
    interval = f" [{ratio.low:.2f}, {ratio.high:.2f}]" if ratio.low is not None else ""
    return f"{ratio.ratio:.2f}{interval} ({ratio.test})"


def fmt_reach(reach: TargetReach | None) -> str:
    if reach is None:
        return "—"
    shown = f"{reach.n_reached}/{reach.n_runs} reached"
    if reach.n_reached:
        shown += f"; {fmt_interval(reach.compute, '.4g')}, median {reach.median:.4g}"
    never = reach.n_runs - reach.n_reached
    return shown + (f"; {never} never" if never else "")


def fmt_search(fit: CurveFit) -> str:
    if not fit.starts:
        return "not run"
    if not fit.converged_starts:
        return f"0/{fit.starts} starts converged"
    return f"{fit.converged_starts}/{fit.starts} starts converged, best in {fit.iterations} iterations"


def pooled_lines(pooled: dict[str, PooledGroup], unit: str, vs: str, baseline: str | None) -> list[str]:
    """The table of the fits pooled over seeds: A, B, C_mid with resampling intervals, the C_mid ratio, speed."""
    header = ["group", "runs pooled", "pooled fit", "A [95 % CI]", "B", f"C_mid ({unit}) [95 % CI]",
              f"C_mid ratio {vs} [95 % CI]", "speed", "seeds to tell"]
    lines = ["Pooled over seeds:", "", "| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for row in pooled.values():
        fit = row.fit
        state = ("fitted" + (f"; no interval: {row.note}" if row.note else f", {row.resamples - row.unfit_resamples}"
                             f"/{row.resamples} resamples fitted")) if fit.params else f"unfit: {fit.reason}"
        b = f"{fit.params.b:.2f}" if fit.params else "—"
        lines.append(f"| {row.group} | {row.n_runs} | {state} | {fmt_interval(row.asymptote, '.3f')} | {b} | "
                     f"{fmt_interval(row.c_mid, '.4g')} | {fmt_ratio(row.ratio)} | "
                     f"{speed_verdict(row.ratio) if baseline else '—'} | "
                     f"{seeds_to_tell(row.ratio, row.n_runs) or '—'} |")
    return lines + [""]


def curves_markdown(tables: list[list[GroupCurves]], pooled_tables: list[dict[str, PooledGroup]], compute_axis: str,
                    baseline: str | None, target_metric: str, target: float, fit_from: float) -> str:
    """Per metric: a group table (A, B, C_mid over seeds, C_mid ratio, compute to target), the fits pooled over
    seeds, then every run's fit."""
    unit = X_AXES[compute_axis]
    vs = f"vs {baseline}" if baseline else "vs baseline"
    lines = []
    for rows, pooled in zip(tables, pooled_tables):
        metric = rows[0].metric
        header = ["group", "fitted", "A [95 % CI]", "B [95 % CI]", f"C_mid ({unit}) [95 % CI]",
                  f"C_mid ratio {vs} [95 % CI]", "speed", f"{unit} to {metric} ≥ {target:g} [95 % CI]"]
        lines += [f"**{metric} against {unit}**", "", "| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
        lines += [
            f"| {row.group} | {len(row.fitted)}/{len(row.runs)} | {fmt_interval(row.asymptote, '.3f')} | "
            f"{fmt_interval(row.efficiency, '.2f')} | {fmt_interval(row.c_mid, '.4g')} | {fmt_ratio(row.ratio)} | "
            f"{speed_verdict(row.ratio) if baseline else '—'} | {fmt_reach(row.target)} |"
            for row in rows
        ]
        lines += [""] + pooled_lines(pooled, unit, vs, baseline)
        lines += ["| run | group | seed | points | A | B | C_mid | RMSE | fit |", "|" + " --- |" * 9]
        for row in rows:
            for curve in row.runs:
                p, fit = curve.fit.params, curve.fit
                values = [f"{p.a:.3f}", f"{p.b:.2f}", f"{p.c_mid:.4g}"] if p else ["—"] * 3
                state = f"fitted ({fmt_search(fit)})" if p else f"unfit: {fit.reason} ({fmt_search(fit)})"
                rmse = "—" if fit.rmse is None else f"{fit.rmse:.3g}"
                lines.append(f"| {curve.run} | {row.group} | {curve.seed or '—'} | {fit.n_points} | "
                             + " | ".join(values) + f" | {rmse} | {state} |")
        lines.append("")
    window = f"points with {unit} > {fit_from:g}" if fit_from > 0 else "every point after compute 0"
    lines.append(
        "Fit: R(C) = R0 + (A − R0) / (1 + (C_mid / C)^B), ScaleRL (arXiv 2510.13786, Eq. 1), per run, R0 = the "
        f"run's evaluation at compute 0, fitted to {window} by Levenberg–Marquardt (numpy) from "
        f"{len(START_B) * START_C_MID_POINTS} starts. A, B: mean over the group's fitted seeds [95 % Student-t "
        "interval of the mean]; C_mid: geometric mean [exponentiated t-interval of the mean log]. C_mid ratio: "
        "exp of the mean difference of log C_mid against the baseline, 95 % t-interval paired on seeds when both "
        "fitted the same seeds, else Welch; \"k× faster\" (slower) only when that interval excludes 1. C_mid is the "
        "compute to half of a run's own gain: read it next to A. A run is unfit (listed with its reason, never "
        f"dropped silently) with fewer than {N_PARAMS + 1} points, no converged start, no gain or a gain the "
        f"F-test against R = R0 cannot tell from 0 (p ≥ {FLAT_ALPHA:g}), or A, B or C_mid on its bound (A ≤ {RATE_MAX:g}, B in [{B_BOUNDS[0]:g}, "
        f"{B_BOUNDS[1]:g}], C_mid within {C_MID_BEYOND:g}× beyond the measured compute). Compute to target "
        f"({target_metric}): the first measured point at or above it; mean [95 % t-interval] and median over the "
        "runs that reached it, the others counted as never. Pooled over seeds: one curve through every run's "
        "points (each as its gain over its own R0; R0 the runs' mean) with the same checks; its intervals are the "
        "fitted value ± the Student-t quantile on n − 1 seeds times the standard deviation over seed resamples (of "
        "A, of log C_mid, of the log C_mid ratio; paired resamples when the group ran the baseline's seeds), and "
        f"need {MIN_FITTED_SHARE:.0%} of the resamples fitted. Seeds to tell: where the ratio's interval includes "
        "1, the seeds per group at which a ratio of this size would have one just excluding it, n × (half-width of "
        "the log interval / |log ratio|)² (a planning figure)."
    )
    return "\n".join(lines) + "\n"


def write_curves_csv(tables: list[list[GroupCurves]], path: Path) -> None:
    """One row per (metric, group); full precision, empty cells where a value does not exist."""
    columns = ["metric", "group", "n_runs", "n_fitted", "a_mean", "a_ci95_low", "a_ci95_high", "b_mean",
               "b_ci95_low", "b_ci95_high", "c_mid_geomean", "c_mid_ci95_low", "c_mid_ci95_high", "c_mid_ratio",
               "c_mid_ratio_ci95_low", "c_mid_ratio_ci95_high", "ratio_test", "speed", "target_n_runs",
               "target_n_reached", "compute_to_target_mean", "compute_to_target_ci95_low",
               "compute_to_target_ci95_high", "compute_to_target_median"]

    def cells(interval):
        return ["", "", ""] if interval is None else [interval.mean, interval.low, interval.high]

    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(columns)
        for rows in tables:
            for row in rows:
                ratio, reach = row.ratio, row.target
                values = [row.metric, row.group, len(row.runs), len(row.fitted), *cells(row.asymptote),
                          *cells(row.efficiency), *cells(row.c_mid),
                          *(["", "", "", ""] if ratio is None else [ratio.ratio, ratio.low, ratio.high, ratio.test]),
                          "" if ratio is None else speed_verdict(ratio),
                          *(["", ""] if reach is None else [reach.n_runs, reach.n_reached]),
                          *cells(None if reach is None else reach.compute), "" if reach is None else reach.median]
                writer.writerow(["" if value is None else value for value in values])


def write_fits_csv(tables: list[list[GroupCurves]], path: Path) -> None:
    """One row per (metric, run): its parameters or why it is unfit, and how the search went."""
    columns = ["metric", "group", "run", "seed", "n_points", "r0", "a", "b", "c_mid", "rmse", "converged_starts",
               "starts", "iterations", "unfit_reason"]
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(columns)
        for rows in tables:
            for row in rows:
                for curve in row.runs:
                    fit = curve.fit
                    params = dataclasses.astuple(fit.params) if fit.params else ("",) * 4
                    writer.writerow([row.metric, row.group, curve.run, curve.seed or "", fit.n_points, *params,
                                     "" if fit.rmse is None else fit.rmse, fit.converged_starts, fit.starts,
                                     fit.iterations, fit.reason])


def write_pooled_csv(tables: list[list[GroupCurves]], pooled_tables: list[dict[str, PooledGroup]], path: Path) -> None:
    """One row per (metric, group) of the fits pooled over seeds; empty cells where a value does not exist."""
    columns = ["metric", "group", "n_runs_pooled", "r0", "a", "a_ci95_low", "a_ci95_high", "b", "c_mid",
               "c_mid_ci95_low", "c_mid_ci95_high", "c_mid_ratio", "c_mid_ratio_ci95_low", "c_mid_ratio_ci95_high",
               "ratio_test", "speed", "seeds_to_tell", "resamples", "unfit_resamples", "unfit_reason",
               "no_interval_reason"]
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(columns)
        for rows, pooled in zip(tables, pooled_tables):
            for row in pooled.values():
                params, ratio = row.fit.params, row.ratio
                intervals = [[i.low, i.high] if i else ["", ""] for i in (row.asymptote, row.c_mid)]
                values = [rows[0].metric, row.group, row.n_runs,
                          *([params.r0, params.a, *intervals[0], params.b, params.c_mid, *intervals[1]] if params
                            else [""] * 8),
                          *(["", "", "", ""] if ratio is None else [ratio.ratio, ratio.low, ratio.high, ratio.test]),
                          "" if ratio is None else speed_verdict(ratio), seeds_to_tell(ratio, row.n_runs),
                          row.resamples, row.unfit_resamples,
                          row.fit.reason, row.note]
                writer.writerow(["" if value is None else value for value in values])


def plot_curves(tables: list[list[GroupCurves]], pooled_tables: list[dict[str, PooledGroup]], compute_axis: str,
                band: str, path: Path) -> bool:
    """One panel per metric: every run's measured points, per group the mean of its seeds' fitted curves with the
    --band over them and its pooled curve (dashed), on a log compute axis (the points at compute 0, R0, are left off
    it). False (nothing written) when nothing was fitted."""
    labels = [row.group for rows in tables for row in rows]
    colours = group_colours(labels)
    figure = Figure(figsize=(5.5 * len(tables) + 3, 4.2), layout="constrained")
    legend: dict[str, object] = {}
    for axes, rows, pooled in zip(figure.subplots(1, len(tables), squeeze=False)[0], tables, pooled_tables):
        for row in rows:
            colour = colours[row.group]
            for curve in row.runs:
                shown = curve.compute > 0
                axes.scatter(curve.compute[shown], curve.values[shown], s=9, color=colour, alpha=0.45, linewidths=0)
            measured = np.concatenate([curve.compute[curve.compute > 0] for curve in row.runs])
            if not measured.size:
                continue
            grid = np.geomspace(measured.min(), measured.max(), CURVE_POINTS)
            if pooled[row.group].fit.params:
                (line,) = axes.plot(grid, saturating_curve(grid, pooled[row.group].fit.params), color=colour,
                                    linestyle="--", linewidth=1.2)
                legend.setdefault(f"{row.group} pooled", line)
            if not row.fitted:
                continue
            mean, low, high = reduce_band(np.stack([saturating_curve(grid, p) for p in row.fitted]), band)
            line = draw_group(axes, grid, mean, low, high, colour, alpha=0.2 if len(rows) <= 3 else 0.1)
            legend.setdefault(f"{row.group} ({len(row.fitted)}/{len(row.runs)} fitted)", line)
        axes.set(xscale="log", xlabel=X_AXES[compute_axis], ylabel=axis_label(rows[0].metric))
        if len(tables) > 1:
            axes.set_title(rows[0].metric)
        axes.grid(True, alpha=0.3)
    if not legend:
        return False
    figure.suptitle(f"Fitted saturating curves (ScaleRL Eq. 1) vs {X_AXES[compute_axis]}", x=0.01, ha="left")
    entries = sorted(legend)
    figure.legend([legend[entry] for entry in entries], entries, loc="outside right upper",
                  title=f"group (band: {band} over seeds' fits; dashed: pooled)")
    figure.savefig(path, dpi=110)
    return True


def compare_curves(groups: dict[str, list[Run]], metrics: list[str], compute_axis: str, fit_from: float,
                   baseline: str | None, target_metric: str, target: float, band: str, out_dir: Path,
                   figures: bool) -> tuple[str, list[Path]]:
    """Fit per seed and pooled, write curves.md, curves.csv, curve_fits.csv, curves_pooled.csv and (with figures)
    curves_vs_<axis>.png; returns the markdown and the files written."""
    compute_key = X_KEYS[compute_axis]
    tables = [fit_groups(groups, metric, compute_key, fit_from, baseline, target if metric == target_metric else None)
              for metric in metrics]
    pooled_tables = [pool_groups({row.group: row.runs for row in rows}, fit_from, baseline) for rows in tables]
    markdown = curves_markdown(tables, pooled_tables, compute_axis, baseline, target_metric, target, fit_from)
    written = [out_dir / "curves.md", out_dir / "curves.csv", out_dir / "curve_fits.csv",
               out_dir / "curves_pooled.csv"]
    written[0].write_text(markdown)
    write_curves_csv(tables, written[1])
    write_fits_csv(tables, written[2])
    write_pooled_csv(tables, pooled_tables, written[3])
    figure = out_dir / f"curves_vs_{compute_axis}.png"
    if figures and plot_curves(tables, pooled_tables, compute_axis, band, figure):
        written.append(figure)
    return markdown, written

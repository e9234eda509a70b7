"""One PNG per metric and x axis (step, wall-clock time, generated tokens): a mean line per group with a band over
its seeds."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import matplotlib
import numpy as np
from matplotlib.figure import Figure  # a bare Figure renders PNGs with Agg, without pyplot's global state
from matplotlib.ticker import MaxNLocator

from tokenpo.compare.runs import Run
from tokenpo.compare.stats import align_on_step, mean_at_steps, reduce_band, series

STEP_KEY = "step"
TIME_KEY = "time/elapsed_s"
EVAL_KEY = "eval/accuracy"
# cumulative tokens generated for training (every dynamic-sampling round, all ranks), logged by the trainer
TOKENS_KEY = "tokens/generated_total"
# x axis name (used in file names) -> axis label; against time (tokens) a step's point sits at the runs' mean
# elapsed time (generated tokens) at that step: the equal-compute view
X_AXES = {"step": "step", "time": "wall-clock time (s)", "tokens": "generated tokens"}
# the per-step record key each x axis other than step reads
X_KEYS = {"time": TIME_KEY, "tokens": TOKENS_KEY}
# units of the metrics that have one beyond a plain number
UNITS = {"response_length/mean": "tokens"}
# series with at most this many points (eval steps) get markers so single points stay visible
MARKER_MAX_POINTS = 30
# groups one axes shows overlaid (layout auto); more get small multiples, GRID_COLUMNS panels a row
OVERLAY_MAX_GROUPS = 6
GRID_COLUMNS = 4
LAYOUTS = ("auto", "overlay", "grid")


@dataclass(frozen=True)
class FigureSpec:
    slug: str  # file name stem before '_vs_step' / '_vs_time'
    title: str
    panels: tuple[str, ...]  # metric keys, one subplot each


FIGURES = (
    # the one training curve no algorithm shapes or filters: the correctness of every response drawn
    FigureSpec("accuracy_drawn", "Correct answers (every drawn response, unshaped)", ("accuracy/drawn",)),
    FigureSpec("reward_mean", "Training reward (shaped: each algorithm's own scale; trained batch)", ("reward/mean",)),
    FigureSpec("accuracy", "Training accuracy (trained batch, after dynamic sampling's filter)", ("accuracy",)),
    FigureSpec("eval_accuracy", "Eval accuracy", (EVAL_KEY,)),
    FigureSpec("entropy_mean", "Policy entropy", ("entropy/mean",)),
    FigureSpec("response_length_mean", "Response length", ("response_length/mean",)),
    FigureSpec("clip_frac", "Clipped-token fraction", ("clip/low_frac", "clip/high_frac")),
    FigureSpec("kl", "KL divergence", ("kl/ref", "kl/old")),
)


# per-benchmark score metrics (tokenpo.evaluation.metrics); diagnostics (eval/<bench>/no_answer_frac...) are not drawn
BENCH_SCORE = re.compile(r"(greedy/accuracy|mean@\d+|pass@\d+|maj@\d+)")


def _score_order(score: str) -> tuple[str, int]:
    """pass@2 before pass@16: name, then k as a number."""
    name, _, k = score.partition("@")
    return name, int(k) if k else 0


def bench_figures(keys: set[str]) -> list[FigureSpec]:
    """One figure per benchmark with a panel per score metric 'eval/<bench>/<score>'.

    eval/<bench>/accuracy is always an alias of greedy/accuracy (or mean@n without greedy) and is not drawn; with a
    single benchmark that alias is also eval/accuracy, so its source metric is left to the eval_accuracy figure.
    """
    scores: dict[str, list[str]] = {}
    for key in keys:
        parts = key.split("/", 2)
        if len(parts) == 3 and parts[0] == "eval" and BENCH_SCORE.fullmatch(parts[2]):
            scores.setdefault(parts[1], []).append(parts[2])
    specs = []
    for bench, names in sorted(scores.items()):
        if len(scores) == 1:
            means = [name for name in names if name.startswith("mean@")]
            headline = "greedy/accuracy" if "greedy/accuracy" in names else (means or [None])[0]
            names = [name for name in names if name != headline]
        if names:
            panels = tuple(f"eval/{bench}/{name}" for name in sorted(names, key=_score_order))
            specs.append(FigureSpec(f"eval_{re.sub(r'[^A-Za-z0-9]+', '_', bench)}", f"Eval {bench}", panels))
    return specs


def group_colours(labels) -> dict[str, str]:
    """Colour per group label, assigned in sorted label order so it does not depend on input order."""
    ordered = sorted(set(labels))
    palette = matplotlib.colormaps["tab10" if len(ordered) <= 10 else "tab20"].colors
    return {label: matplotlib.colors.to_hex(palette[i % len(palette)]) for i, label in enumerate(ordered)}


def axis_label(key: str) -> str:
    return f"{key} ({UNITS[key]})" if key in UNITS else key


def isolated(banded: np.ndarray) -> np.ndarray:
    """The points that have a band while neither neighbour has one: fill_between draws nothing at those."""
    padded = np.concatenate([[False], banded, [False]])
    return banded & ~padded[:-2] & ~padded[2:]


def draw_group(axes, xs, mean, low, high, colour: str, alpha: float):
    """One group's mean line and band on axes; returns the line (for the legend)."""
    (line,) = axes.plot(
        xs, mean, color=colour, linewidth=1.6, marker="o" if xs.size <= MARKER_MAX_POINTS else None, markersize=3
    )
    axes.fill_between(xs, low, high, color=colour, alpha=alpha, linewidth=0)
    # thin dotted edges keep each band's extent readable where several bands overlap
    for edge in (low, high):
        axes.plot(xs, edge, color=colour, linewidth=0.7, linestyle=":", alpha=0.8)
    # a banded point without banded neighbours (e.g. one eval at the last step) has no area to fill: bar it
    lone = isolated(np.isfinite(low) & np.isfinite(high))
    if lone.any():
        axes.errorbar(
            xs[lone], mean[lone], yerr=[mean[lone] - low[lone], high[lone] - mean[lone]], fmt="none", ecolor=colour,
            elinewidth=1.0, capsize=3,
        )
    return line


def group_curve(runs: list[Run], key: str, x_axis: str, band: str):
    """(xs, mean, low, high, runs that logged `key`) of one group against `x_axis`, or None with nothing to draw."""
    logged = [(run, xy) for run in runs if (xy := series(run.records, key))[0].size]
    if not logged:
        return None
    xs, matrix = align_on_step([xy for _, xy in logged])
    if x_axis in X_KEYS:
        xs = mean_at_steps(xs, [series(run.records, X_KEYS[x_axis]) for run, _ in logged])
        matrix = matrix[:, ~np.isnan(xs)]
        xs = xs[~np.isnan(xs)]
    if not xs.size:  # e.g. runs from before the trainer logged generated tokens
        return None
    return (xs, *reduce_band(matrix, band), len(logged))


def style_axes(axes, key: str, x_axis: str) -> None:
    axes.set(xlabel=X_AXES[x_axis], ylabel=axis_label(key))
    if x_axis == "step":
        axes.xaxis.set_major_locator(MaxNLocator(integer=True))  # no 1.5-step ticks on short runs
    axes.grid(True, alpha=0.3)


def plot_figure(
    spec: FigureSpec, groups: dict[str, list[Run]], colours: dict[str, str], x_axis: str, band: str, path: Path
) -> bool:
    """Write the figure to path; False (nothing written) when no group has any point to draw."""
    x_label = X_AXES[x_axis]
    figure = Figure(figsize=(5.5 * len(spec.panels) + 3, 4.2), layout="constrained")
    legend: dict[str, object] = {}
    for axes, key in zip(figure.subplots(1, len(spec.panels), squeeze=False)[0], spec.panels):
        for label, runs in groups.items():
            curve = group_curve(runs, key, x_axis, band)
            if curve is None:
                continue
            xs, mean, low, high, count = curve
            line = draw_group(axes, xs, mean, low, high, colours[label], alpha=0.2 if len(groups) <= 3 else 0.1)
            legend.setdefault(f"{label} (n={count})", line)
        style_axes(axes, key, x_axis)
        if len(spec.panels) > 1:
            axes.set_title(key)
    if not legend:
        return False
    # left-aligned so a long title does not run under the legend at the upper right
    figure.suptitle(f"{spec.title} vs {x_label}", x=0.01, ha="left")
    entries = sorted(legend)  # same order in every figure, whichever panel drew a group first
    figure.legend([legend[entry] for entry in entries], entries, loc="outside right upper", title=f"group (band: {band})")
    figure.savefig(path, dpi=110)
    return True


def plot_grid(spec: FigureSpec, groups: dict[str, list[Run]], colours: dict[str, str], x_axis: str, band: str,
              path: Path) -> bool:
    """Small multiples: one panel per group (its mean and band in its colour, every other group's mean in light grey
    behind it, shared axes), one row of panels per metric of `spec`; False when no group has a point to draw."""
    curves = {key: {label: group_curve(runs, key, x_axis, band) for label, runs in groups.items()}
              for key in spec.panels}
    if not any(curve is not None for by_group in curves.values() for curve in by_group.values()):
        return False
    columns = min(GRID_COLUMNS, len(groups))
    rows_per_metric = -(-len(groups) // columns)
    figure = Figure(figsize=(3.4 * columns + 0.5, 2.8 * rows_per_metric * len(spec.panels) + 0.6), layout="constrained")
    # one metric: every panel on one y scale; several: each metric's rows on its own
    grid = figure.subplots(rows_per_metric * len(spec.panels), columns, squeeze=False, sharex=True,
                           sharey=len(spec.panels) == 1 or "row")
    for metric_index, (key, by_group) in enumerate(curves.items()):
        for index, label in enumerate(groups):
            axes = grid[metric_index * rows_per_metric + index // columns][index % columns]
            for other, curve in by_group.items():
                if curve is not None and other != label:
                    axes.plot(curve[0], curve[1], color="0.8", linewidth=0.8)
            curve = by_group[label]
            if curve is not None:
                xs, mean, low, high, count = curve
                draw_group(axes, xs, mean, low, high, colours[label], alpha=0.25)
            axes.set_title(f"{label} (n={curve[4] if curve else 0})" + (f"\n{key}" if len(spec.panels) > 1 else ""),
                           fontsize=8)
            style_axes(axes, key, x_axis)
        for index in range(len(groups), rows_per_metric * columns):  # the last row's empty panels
            grid[metric_index * rows_per_metric + index // columns][index % columns].set_visible(False)
    figure.suptitle(f"{spec.title} vs {X_AXES[x_axis]} (band: {band}; grey: the other groups' means)", x=0.01,
                    ha="left")
    figure.savefig(path, dpi=100)
    return True


def plot_all(groups: dict[str, list[Run]], band: str, out_dir: Path, layout: str = "auto") -> list[Path]:
    """Every standard and per-benchmark figure against step, time and generated tokens; returns the PNGs written.
    `layout`: overlay (every group on one axes), grid (small multiples, one panel per group) or auto (grid above
    OVERLAY_MAX_GROUPS groups, where overlaid bands are no longer readable)."""
    colours = group_colours(groups)
    keys = {key for runs in groups.values() for run in runs for record in run.records for key in record}
    draw = plot_grid if layout == "grid" or (layout == "auto" and len(groups) > OVERLAY_MAX_GROUPS) else plot_figure
    written = []
    for spec in (*FIGURES, *bench_figures(keys)):
        for x_axis in X_AXES:
            path = out_dir / f"{spec.slug}_vs_{x_axis}.png"
            if draw(spec, groups, colours, x_axis, band, path):
                written.append(path)
    return written

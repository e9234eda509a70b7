"""Per-group summary: final / best eval accuracy, steps- and time-to-target, ratios against a baseline."""

from __future__ import annotations

import csv
import dataclasses
from dataclasses import dataclass
from pathlib import Path

from tokenpo.compare.plots import EVAL_KEY, TIME_KEY
from tokenpo.compare.runs import Run
from tokenpo.compare.stats import first_reaching, mean_and_std, ratio, series

# shown in the markdown table where a value does not exist (no eval, target never reached)
NONE = "—"


@dataclass(frozen=True)
class GroupSummary:
    group: str
    n_runs: int
    # over the runs that logged eval/accuracy; final = each run's last eval value, best = its max
    final_eval_mean: float | None
    final_eval_std: float | None
    best_eval_mean: float | None
    best_eval_std: float | None
    # runs whose target metric reached the target; the means below are over those runs only
    n_reached: int
    steps_to_target_mean: float | None
    time_to_target_s_mean: float | None
    # group mean / baseline group mean (0.5 = reaches the target in half the steps / time)
    steps_ratio_vs_baseline: float | None = None
    time_ratio_vs_baseline: float | None = None


def summarize_group(label: str, runs: list[Run], target_metric: str, target: float) -> GroupSummary:
    evals = [ys for _, ys in (series(run.records, EVAL_KEY) for run in runs) if ys.size]
    hits = [hit for hit in (first_reaching(run.records, target_metric, target) for run in runs) if hit is not None]
    steps_mean, _ = mean_and_std([hit["step"] for hit in hits])
    time_mean, _ = mean_and_std([hit[TIME_KEY] for hit in hits if TIME_KEY in hit])
    return GroupSummary(
        label,
        len(runs),
        *mean_and_std([ys[-1] for ys in evals]),
        *mean_and_std([ys.max() for ys in evals]),
        len(hits),
        steps_mean,
        time_mean,
    )


def with_baseline_ratios(summaries: list[GroupSummary], baseline: str) -> list[GroupSummary]:
    base = next(summary for summary in summaries if summary.group == baseline)
    return [
        dataclasses.replace(
            summary,
            steps_ratio_vs_baseline=ratio(summary.steps_to_target_mean, base.steps_to_target_mean),
            time_ratio_vs_baseline=ratio(summary.time_to_target_s_mean, base.time_to_target_s_mean),
        )
        for summary in summaries
    ]


def summary_columns() -> list[str]:
    return [column.name for column in dataclasses.fields(GroupSummary)]


def write_csv(summaries: list[GroupSummary], path: Path) -> None:
    """Full-precision numbers; an empty cell where a value does not exist."""
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(summary_columns())
        writer.writerows(["" if value is None else value for value in dataclasses.astuple(summary)] for summary in summaries)


def fmt(value: float | None, digits: int) -> str:
    return NONE if value is None else f"{value:.{digits}f}"


def fmt_mean_std(mean: float | None, std: float | None) -> str:
    return NONE if mean is None else f"{mean:.3f} ± {std:.3f}"


def markdown_report(
    summaries: list[GroupSummary], notes: list[str], target_metric: str, target: float, baseline: str | None
) -> str:
    """The summary table plus a list of what is missing or was skipped."""
    reach = f"{target_metric} ≥ {target:g}"
    vs = f"vs {baseline}" if baseline else "vs baseline"
    header = [
        "group", "runs", f"final {EVAL_KEY}", f"best {EVAL_KEY}", f"reached {reach}",
        "steps to target", "time to target (s)", f"steps ratio {vs}", f"time ratio {vs}",
    ]
    base = next((s for s in summaries if s.group == baseline), None)
    # a ratio of means over only the runs that reached the target, where some runs of the group or of the
    # baseline did not: marked, so it is read next to the reached column
    mark = {
        s.group: "*" if s is not base and s.steps_ratio_vs_baseline is not None
        and any(x.n_reached < x.n_runs for x in (s, base)) else ""
        for s in summaries
    }
    rows = [
        [
            s.group, str(s.n_runs), fmt_mean_std(s.final_eval_mean, s.final_eval_std),
            fmt_mean_std(s.best_eval_mean, s.best_eval_std), f"{s.n_reached}/{s.n_runs}",
            fmt(s.steps_to_target_mean, 1), fmt(s.time_to_target_s_mean, 1),
            fmt(s.steps_ratio_vs_baseline, 2) + mark[s.group], fmt(s.time_ratio_vs_baseline, 2) + mark[s.group],
        ]
        for s in summaries
    ]
    lines = ["| " + " | ".join(row) + " |" for row in [header, ["---"] * len(header), *rows]]
    lines += [
        "",
        "mean ± sample std (ddof=1; 0 for a single run) over runs; steps/time to target: mean over the runs "
        f"that reached {reach} (first logged step at or above it).",
    ]
    if "*" in mark.values():
        lines += ["", "\\* ratio of means over the runs that reached the target only: some runs of this group or of the "
                      "baseline did not."]
    if notes:
        lines += ["", "Missing or skipped:", *(f"- {note}" for note in notes)]
    return "\n".join(lines) + "\n"

"""Per-group summary: final / best target metric with 95 % intervals, steps-, time- and tokens-to-target, ratios
against a baseline."""

from __future__ import annotations

import csv
import dataclasses
from dataclasses import dataclass
from pathlib import Path

from tokenpo.compare.plots import TIME_KEY, TOKENS_KEY
from tokenpo.compare.runs import Run
from tokenpo.compare.stats import first_reaching, mean_and_ci95, mean_and_std, ratio, series

# shown in the markdown table where a value does not exist (no eval, target never reached)
NONE = "—"


@dataclass(frozen=True)
class GroupSummary:
    group: str
    n_runs: int
    # over the runs that logged the target metric; final = each run's last value, best = its max; ci95: the
    # mean's 95 % Student-t interval, mean ± t_{0.975, n-1} * std / sqrt(n) (None for a single run)
    final_eval_mean: float | None
    final_eval_std: float | None
    final_eval_ci95_low: float | None
    final_eval_ci95_high: float | None
    best_eval_mean: float | None
    best_eval_std: float | None
    best_eval_ci95_low: float | None
    best_eval_ci95_high: float | None
    # runs whose target metric reached the target; the means below are over those runs only
    n_reached: int
    steps_to_target_mean: float | None
    time_to_target_s_mean: float | None
    # generated tokens (all dynamic-sampling rounds) until the target: the equal-compute count
    tokens_to_target_mean: float | None
    # group mean / baseline group mean (0.5 = reaches the target in half the steps / time / tokens)
    steps_ratio_vs_baseline: float | None = None
    time_ratio_vs_baseline: float | None = None
    tokens_ratio_vs_baseline: float | None = None


def mean_std_ci(values) -> tuple[float | None, float | None, float | None, float | None]:
    mean, std = mean_and_std(values)
    _, low, high = mean_and_ci95(values)
    return mean, std, low, high


def summarize_group(label: str, runs: list[Run], target_metric: str, target: float) -> GroupSummary:
    values = [ys for _, ys in (series(run.records, target_metric) for run in runs) if ys.size]
    hits = [hit for hit in (first_reaching(run.records, target_metric, target) for run in runs) if hit is not None]
    steps_mean, _ = mean_and_std([hit["step"] for hit in hits])
    time_mean, _ = mean_and_std([hit[TIME_KEY] for hit in hits if TIME_KEY in hit])
    tokens_mean, _ = mean_and_std([hit[TOKENS_KEY] for hit in hits if TOKENS_KEY in hit])
    return GroupSummary(
        label,
        len(runs),
        *mean_std_ci([ys[-1] for ys in values]),
        *mean_std_ci([ys.max() for ys in values]),
        len(hits),
        steps_mean,
        time_mean,
        tokens_mean,
    )


def with_baseline_ratios(summaries: list[GroupSummary], baseline: str) -> list[GroupSummary]:
    base = next(summary for summary in summaries if summary.group == baseline)
    return [
        dataclasses.replace(
            summary,
            steps_ratio_vs_baseline=ratio(summary.steps_to_target_mean, base.steps_to_target_mean),
            time_ratio_vs_baseline=ratio(summary.time_to_target_s_mean, base.time_to_target_s_mean),
            tokens_ratio_vs_baseline=ratio(summary.tokens_to_target_mean, base.tokens_to_target_mean),
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


def fmt_mean_std_ci(mean: float | None, std: float | None, low: float | None, high: float | None) -> str:
    if mean is None:
        return NONE
    interval = "n/a: 1 run" if low is None else f"{low:.3f}, {high:.3f}"
    return f"{mean:.3f} ± {std:.3f} [{interval}]"


def fmt_ratio(value: float | None, mark: str) -> str:
    return NONE if value is None else f"{value:.2f}{mark}"


def fmt_tokens(value: float | None) -> str:
    return NONE if value is None else f"{value:.4g}"


def markdown_report(
    summaries: list[GroupSummary], notes: list[str], target_metric: str, target: float, baseline: str | None,
    significance: str = "", environment: list[str] | None = None,
) -> str:
    """The summary table, the significance tables against the baseline (when given), where the runs were measured,
    and a list of what is missing or was skipped."""
    reach = f"{target_metric} ≥ {target:g}"
    vs = f"vs {baseline}" if baseline else "vs baseline"
    header = [
        "group", "runs", f"final {target_metric}: mean ± std [95 % CI]", f"best {target_metric}: mean ± std [95 % CI]",
        f"reached {reach}", "steps to target", "time to target (s)", "tokens to target",
        f"steps ratio {vs}", f"time ratio {vs}", f"tokens ratio {vs}",
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
            s.group, str(s.n_runs),
            fmt_mean_std_ci(s.final_eval_mean, s.final_eval_std, s.final_eval_ci95_low, s.final_eval_ci95_high),
            fmt_mean_std_ci(s.best_eval_mean, s.best_eval_std, s.best_eval_ci95_low, s.best_eval_ci95_high),
            f"{s.n_reached}/{s.n_runs}", fmt(s.steps_to_target_mean, 1), fmt(s.time_to_target_s_mean, 1),
            fmt_tokens(s.tokens_to_target_mean), fmt_ratio(s.steps_ratio_vs_baseline, mark[s.group]),
            fmt_ratio(s.time_ratio_vs_baseline, mark[s.group]), fmt_ratio(s.tokens_ratio_vs_baseline, mark[s.group]),
        ]
        for s in summaries
    ]
    lines = ["| " + " | ".join(row) + " |" for row in [header, ["---"] * len(header), *rows]]
    lines += [
        "",
        "mean ± sample std (ddof=1; 0 for a single run) over runs [95 % Student-t interval of the mean, "
        "mean ± t_{0.975, n−1} · std / √n]; steps/time/tokens to target: mean over the runs that reached "
        f"{reach} (first logged step at or above it); tokens: generated for training, all dynamic-sampling rounds.",
    ]
    if "*" in mark.values():
        lines += ["", "\\* ratio of means over the runs that reached the target only: some runs of this group or of the "
                      "baseline did not."]
    if significance:
        lines += ["", f"## Significance vs {baseline}", "", significance.rstrip("\n")]
    if environment:
        lines += ["", "Measured on:", *environment]
    if notes:
        lines += ["", "Missing or skipped:", *(f"- {note}" for note in notes)]
    return "\n".join(lines) + "\n"

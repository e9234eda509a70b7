"""Is a group's final / best --target-metric different from the baseline's? The per-run values of the two
groups go through a paired t-test when both ran the same seeds (same seed -> same prompt order), Welch's t-test
otherwise; each table's p-values are Holm-corrected together."""

from __future__ import annotations

import csv
import dataclasses
import math
from dataclasses import dataclass
from statistics import NormalDist
from pathlib import Path

import numpy as np

from tokenpo.compare.runs import Run
from tokenpo.compare.stats import CI_PROB, sample_std, series
from tokenpo.compare.student_t import t_quantile, t_two_sided_p

# family-wise error rate the Holm-adjusted p-values are held to
ALPHA = 0.05
# the power the seeds-needed column plans for, and where its search stops (a larger answer is "≥ this")
POWER = 0.8
MAX_PLANNED_SEEDS = 10_000
# the override that pairs runs across groups: runs with the same seed draw the same prompts in the same order
SEED_KEY = "seed"
# what is compared of each run: the last logged value of the metric, or its best (max) one
RUN_VALUE = {"final": lambda ys: float(ys[-1]), "best": lambda ys: float(ys.max())}


@dataclass(frozen=True)
class TTest:
    name: str  # "paired (n=5)" or "Welch (n=3 vs 4)"
    difference: float  # mean of group - baseline
    ci_low: float  # 95 % Student-t interval of the difference
    ci_high: float
    t: float
    df: float
    p: float  # two-sided
    # variance of the difference with one seed (one pair's difference, or one run of each group): the spread the
    # seeds-needed estimate plans with
    unit_variance: float


@dataclass(frozen=True)
class Comparison:
    group: str
    n_group: int  # runs that logged the metric
    n_baseline: int
    difference: float | None  # mean(group) - mean(baseline); None when either has no value
    test: TTest | None
    note: str  # why there is no test ("n/a: 1 seed"), empty with one
    p_holm: float | None = None
    margin: float | None = None  # equivalence margin named in advance (--margin), in the metric's units


def t_test(name: str, difference: float, standard_error: float, df: float, unit_variance: float) -> TTest | None:
    """The t statistic, two-sided p and 95 % interval of a difference; None without spread (t undefined)."""
    if standard_error == 0.0:
        return None
    half = t_quantile(CI_PROB, df) * standard_error
    t = difference / standard_error
    return TTest(name, difference, difference - half, difference + half, t, df, t_two_sided_p(t, df), unit_variance)


def welch_t_test(group, baseline) -> TTest | None:
    """Welch's unequal-variance t-test of mean(group) - mean(baseline), Welch–Satterthwaite df."""
    a, b = np.asarray(group, dtype=float), np.asarray(baseline, dtype=float)
    var_a, var_b = sample_std(a) ** 2 / a.size, sample_std(b) ** 2 / b.size
    if var_a + var_b == 0.0:
        return None
    df = (var_a + var_b) ** 2 / (var_a**2 / (a.size - 1) + var_b**2 / (b.size - 1))
    return t_test(f"Welch (n={a.size} vs {b.size})", float(a.mean() - b.mean()), math.sqrt(var_a + var_b), df,
                  sample_std(a) ** 2 + sample_std(b) ** 2)


def paired_t_test(group, baseline) -> TTest | None:
    """Paired t-test of the per-pair differences group[i] - baseline[i], n - 1 df."""
    differences = np.asarray(group, dtype=float) - np.asarray(baseline, dtype=float)
    n = differences.size
    return t_test(f"paired (n={n})", float(differences.mean()), sample_std(differences) / math.sqrt(n), n - 1,
                  sample_std(differences) ** 2)


def seeds_needed(unit_variance: float, effect: float, one_sided_alpha: float) -> int | None:
    """The fewest seeds (pairs, or runs per group) at which a t-test at one-sided level `one_sided_alpha` finds an
    `effect` with about POWER, when one seed's difference has variance `unit_variance`: the least n >= 2 with
    n >= (t_{1-alpha, n-1} + t_{POWER, n-1})^2 var / effect^2 (the usual planning formula, Julious 2004), searched
    up from its normal approximation; None for no effect."""
    if effect == 0.0:
        return None
    ratio = unit_variance / effect**2
    normal = NormalDist()
    n = max(2, math.ceil((normal.inv_cdf(1 - one_sided_alpha) + normal.inv_cdf(POWER)) ** 2 * ratio))
    while n < MAX_PLANNED_SEEDS and (t_quantile(1 - one_sided_alpha, n - 1) + t_quantile(POWER, n - 1)) ** 2 * ratio > n:
        n += 1
    return n


def seeds_to_detect(test: TTest) -> int | None:
    """Seeds for the observed difference to be significant (two-sided ALPHA before Holm's correction) at POWER."""
    return seeds_needed(test.unit_variance, test.difference, ALPHA / 2)


def seeds_for_margin(test: TTest, margin: float) -> int | None:
    """Seeds for the 95 % interval to fit inside ±margin at POWER if the true difference is the observed one (two
    one-sided tests at 2.5 %); None when the observed difference is already at or past the margin."""
    room = margin - abs(test.difference)
    return seeds_needed(test.unit_variance, room, (1 - CI_PROB)) if room > 0 else None


def holm_adjust(p_values: list[float]) -> list[float]:
    """Holm's step-down adjustment (Holm 1979): the i-th smallest of m p-values times (m - i + 1), made
    non-decreasing in that order and capped at 1; returned in the input order."""
    adjusted = [0.0] * len(p_values)
    running = 0.0
    for rank, index in enumerate(sorted(range(len(p_values)), key=p_values.__getitem__)):
        running = max(running, min(1.0, (len(p_values) - rank) * p_values[index]))
        adjusted[index] = running
    return adjusted


def seed_values(runs: list[Run], metric: str, which: str) -> list[tuple[str | None, float]]:
    """(seed override or None, final or best value) of each run that logged the metric."""
    reduce = RUN_VALUE[which]
    return [(run.overrides.get(SEED_KEY), reduce(ys)) for run in runs if (ys := series(run.records, metric)[1]).size]


def paired_by_seed(group, baseline) -> tuple[list[float], list[float]] | None:
    """Both groups' values in seed order when each ran exactly the same seeds once; None otherwise."""
    group_seeds, baseline_seeds = [seed for seed, _ in group], [seed for seed, _ in baseline]
    if None in group_seeds or len(set(group_seeds)) < len(group) or len(set(baseline_seeds)) < len(baseline):
        return None
    if set(group_seeds) != set(baseline_seeds):
        return None
    by_seed = dict(baseline)
    return [value for _, value in sorted(group)], [by_seed[seed] for seed, _ in sorted(group)]


def seeds(n: int) -> str:
    return f"{n} seed" if n == 1 else f"{n} seeds"


def baseline_test(group, baseline) -> tuple[TTest | None, str]:
    """(test, "") or (None, why not): a test needs 2 values per group (2 pairs when paired) and some spread."""
    if len(group) < 2 or len(baseline) < 2:
        too_few = [seeds(len(group))] if len(group) < 2 else []
        too_few += [f"baseline has {seeds(len(baseline))}"] if len(baseline) < 2 else []
        return None, "n/a: " + ", ".join(too_few)
    pairs = paired_by_seed(group, baseline)
    test = paired_t_test(*pairs) if pairs else welch_t_test([v for _, v in group], [v for _, v in baseline])
    return (test, "") if test else (None, "n/a: no spread (t undefined)")


def compare_to_baseline(groups: dict[str, list[Run]], baseline: str, metric: str, which: str,
                        margin: float | None = None) -> list[Comparison]:
    """One row per non-baseline group; the rows that have a test get Holm-adjusted p-values over this table, and
    with an equivalence `margin` the verdict of their interval against it."""
    base = seed_values(groups[baseline], metric, which)
    rows = []
    for label, runs in groups.items():
        if label == baseline:
            continue
        values = seed_values(runs, metric, which)
        test, note = baseline_test(values, base)
        difference = float(np.mean([v for _, v in values]) - np.mean([v for _, v in base])) if values and base else None
        rows.append(Comparison(label, len(values), len(base), difference, test, note, margin=margin))
    adjusted = iter(holm_adjust([row.test.p for row in rows if row.test]))
    return [dataclasses.replace(row, p_holm=next(adjusted)) if row.test else row for row in rows]


def result(row: Comparison) -> str:
    """Significant only after Holm; a non-significant difference is never called higher or lower. With a margin M,
    "equivalent" only when the whole 95 % interval lies inside ±M (an interval wider than that shows neither)."""
    if row.test is None:
        return row.note
    within = inside_margin(row)
    if row.p_holm < ALPHA:
        verdict = "significant: higher" if row.test.difference > 0 else "significant: lower"
        return verdict + (f", within ±{row.margin:g}" if within else "")
    if row.margin is None:
        return "not significant"
    return f"equivalent within ±{row.margin:g}" if within else f"not significant, not shown within ±{row.margin:g}"


def inside_margin(row: Comparison) -> bool:
    """Whether the row's whole 95 % interval lies inside ±margin (False without a margin or a test)."""
    return (row.margin is not None and row.test is not None
            and -row.margin <= row.test.ci_low and row.test.ci_high <= row.margin)


def undecided(row: Comparison) -> bool:
    """A tested row neither significant nor shown equivalent."""
    return row.p_holm >= ALPHA and not inside_margin(row)


def planned_seeds(row: Comparison) -> tuple[int | None, int | None]:
    """(seeds for the observed difference to be significant, seeds for the interval to fit the margin), each None
    where the row needs no more (already significant or equivalent; inside the margin, or none) or no count exists."""
    if row.test is None:
        return None, None
    detect = seeds_to_detect(row.test) if undecided(row) else None
    fit = seeds_for_margin(row.test, row.margin) if row.margin is not None and not inside_margin(row) else None
    return detect, fit


def fmt_seeds(n: int) -> str:
    return f"≥ {MAX_PLANNED_SEEDS}" if n >= MAX_PLANNED_SEEDS else str(n)


def fmt_planned(row: Comparison) -> str:
    """The seeds-needed cell: what more seeds at this spread would show, for a row its seeds left undecided."""
    if row.test is None:
        return "—"
    detect, fit = planned_seeds(row)
    parts = []
    if undecided(row):
        parts.append(f"{fmt_seeds(detect)} to detect" if detect else "no difference to detect")
    if row.margin is not None and not inside_margin(row):
        parts.append(f"{fmt_seeds(fit)} for ±{row.margin:g}" if fit else f"never for ±{row.margin:g}")
    return "; ".join(parts) or "—"


def fmt_p(p: float | None) -> str:
    return "—" if p is None else ("<0.001" if p < 0.001 else f"{p:.3f}")


def fmt_difference(row: Comparison) -> str:
    if row.difference is None:
        return "—"
    interval = f" [{row.test.ci_low:+.3f}, {row.test.ci_high:+.3f}]" if row.test else ""
    return f"{row.difference:+.3f}{interval}"


def significance_markdown(tables: dict[str, list[Comparison]], metric: str, baseline: str) -> str:
    """A table per compared value (final, best) with a line on how to read them."""
    header = ["group", "seeds (group vs baseline)", "test", "difference [95 % CI]", "p", "p (Holm)", "result",
              f"seeds for {round(POWER * 100)} % power"]
    lines = []
    for which, rows in tables.items():
        lines += [f"**{which} {metric}, group − {baseline}**", "", "| " + " | ".join(header) + " |",
                  "|" + " --- |" * len(header)]
        lines += [
            f"| {row.group} | {row.n_group} vs {row.n_baseline} | {row.test.name if row.test else '—'} | "
            f"{fmt_difference(row)} | {fmt_p(row.test and row.test.p)} | {fmt_p(row.p_holm)} | {result(row)} | "
            f"{fmt_planned(row)} |"
            for row in rows
        ]
        lines.append("")
    lines.append(
        f"final = each run's last logged {metric}, best = its maximum. Paired t-test on the per-seed differences "
        "when both groups ran the same seeds (same seed, same prompt order), else Welch's t-test (Welch–Satterthwaite "
        "df); two-sided p; 95 % Student-t interval of the difference. p (Holm): Holm-corrected over the tested rows "
        f"of that table; significant = p (Holm) < {ALPHA:g}. \"not significant\" with few seeds means the runs cannot "
        "tell, not that the groups are equal. Seeds for 80 % power: at the observed spread and difference, the "
        f"seeds (pairs, or runs per group) at which the difference would be significant (two-sided {ALPHA:g} "
        "before Holm's correction) and, with a margin, at which its interval would fit inside it (\"never\": the "
        "difference is at or past the margin); planning figures from 5 or so seeds, themselves uncertain."
    )
    margins = {row.margin for rows in tables.values() for row in rows if row.margin is not None}
    if margins:
        lines[-1] += (f" Equivalence margin ±{min(margins):g}, named before the runs: \"equivalent\" = the whole 95 % "
                      "interval of the difference lies inside it (two one-sided tests at 2.5 % each, not Holm-corrected).")
    return "\n".join(lines) + "\n"


def write_significance_csv(tables: dict[str, list[Comparison]], metric: str, baseline: str, path: Path) -> None:
    """Full-precision numbers, one row per (final/best, group); empty cells where no test ran."""
    columns = ["value", "metric", "group", "baseline", "n_group", "n_baseline", "test", "difference",
               "ci95_low", "ci95_high", "t", "df", "p", "p_holm", "result", "seeds_to_detect", "seeds_for_margin"]
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(columns)
        for which, rows in tables.items():
            for row in rows:
                test = row.test
                stats = [test.name, row.difference, test.ci_low, test.ci_high, test.t, test.df, test.p, row.p_holm] \
                    if test else ["", "" if row.difference is None else row.difference, *[""] * 6]
                planned = ["" if n is None else n for n in planned_seeds(row)]
                writer.writerow([which, metric, row.group, baseline, row.n_group, row.n_baseline, *stats, result(row),
                                 *planned])

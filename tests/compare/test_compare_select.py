"""tokenpo.compare for many groups (issue 42, trap 2 and 9): results outside the compared runs by default, a subset of
groups picked with --select, small multiples above six groups, and the first figure the unshaped correctness of
every drawn response."""

from __future__ import annotations

import csv

import matplotlib.image
import pytest

from tokenpo.compare import main
from tokenpo.compare.plots import FIGURES

GROUPS = 8


@pytest.fixture
def sweep(tmp_path, run_writer):
    """8 algorithms x 2 seeds, 3 steps each, a sweep folder inside a 'repository'."""
    root = tmp_path / "repo" / "docs" / "data" / "sweep"
    for index in range(GROUPS * 2):
        group, seed = divmod(index, 2)
        records = [{"step": step, "time/elapsed_s": 2.0 * step, "tokens/generated_total": 100.0 * step,
                    "accuracy/drawn": 0.05 * group + 0.01 * step, "reward/mean": -1 + 0.1 * step,
                    "accuracy": 0.3 + 0.01 * step, "eval/accuracy": 0.1 * group + 0.02 * seed}
                   for step in (1, 2, 3)]
        run_writer(root / str(index), [f"algorithm=a{group}", f"seed={seed}"], records)
    return root


def groups_in(out) -> list[str]:
    with (out / "summary.csv").open() as handle:
        return sorted(row["group"] for row in csv.DictReader(handle))


def test_results_go_outside_the_inputs_and_many_groups_get_small_multiples(sweep, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main([str(sweep), "--no-figures"]) == 0
    assert not any(path.name == "compare" for path in sweep.rglob("*"))  # nothing written into the runs
    out = tmp_path / "outputs" / "compare" / "sweep"
    assert groups_in(out) == [f"algorithm=a{group}" for group in range(GROUPS)]

    grid, overlay = tmp_path / "grid", tmp_path / "overlay"
    assert main([str(sweep), "--out", str(grid)]) == 0  # auto: 8 groups are more than one axes shows
    assert main([str(sweep), "--out", str(overlay), "--layout", "overlay"]) == 0
    grid_png = matplotlib.image.imread(grid / "accuracy_drawn_vs_step.png")
    overlay_png = matplotlib.image.imread(overlay / "accuracy_drawn_vs_step.png")
    # 4 panels a row, 2 rows: wider and taller than the one overlaid axes
    assert grid_png.shape[1] > 1.3 * overlay_png.shape[1] and grid_png.shape[0] > 1.3 * overlay_png.shape[0]


def test_select_picks_groups_and_keeps_the_baseline(sweep, tmp_path):
    out = tmp_path / "picked"
    assert main([str(sweep), "--select", "algorithm=a3", "--select", "algorithm=a5", "--baseline", "algorithm=a0",
                 "--no-figures", "--out", str(out)]) == 0
    assert groups_in(out) == ["algorithm=a0", "algorithm=a3", "algorithm=a5"]


def test_a_selector_that_picks_nothing_is_one_line(sweep, tmp_path, capsys):
    assert main([str(sweep), "--select", "algorithm=zz", "--out", str(tmp_path / "none")]) == 1
    error = capsys.readouterr().err.strip()
    assert error.startswith("tokenpo-compare: --select 'algorithm=zz' matches no group; groups: algorithm=a0 |")


def test_the_first_figure_is_the_unshaped_correctness_and_the_shaped_ones_say_so():
    assert FIGURES[0].panels == ("accuracy/drawn",) and "unshaped" in FIGURES[0].title
    titles = {spec.panels: spec.title for spec in FIGURES}
    assert "shaped" in titles[("reward/mean",)] and "dynamic sampling's filter" in titles[("accuracy",)]

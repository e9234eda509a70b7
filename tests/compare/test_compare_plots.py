import numpy as np
from matplotlib.container import ErrorbarContainer
from matplotlib.figure import Figure

from tokenpo.compare.plots import FIGURES, bench_figures, draw_group, group_colours, isolated, plot_figure
from tokenpo.compare.runs import Run


def test_group_colours_do_not_depend_on_order():
    labels = ["algorithm=grpo", "algorithm=dapo", "algorithm=tepo"]
    colours = group_colours(labels)
    assert colours == group_colours(reversed(labels))
    assert len(set(colours.values())) == 3
    # sorted order picks tab10's first colours: dapo blue, grpo orange
    assert colours["algorithm=dapo"] == "#1f77b4" and colours["algorithm=grpo"] == "#ff7f0e"


def test_bench_figures_one_per_benchmark_with_its_score_panels():
    keys = {
        "eval/accuracy", "accuracy", "eval/aime24/accuracy", "eval/aime24/greedy/accuracy", "eval/aime24/mean@16",
        "eval/aime24/pass@16", "eval/aime24/pass@2", "eval/aime24/no_answer_frac", "eval/math500/greedy/accuracy",
    }
    specs = bench_figures(keys)
    assert [(spec.slug, spec.panels) for spec in specs] == [
        ("eval_aime24", (
            "eval/aime24/greedy/accuracy", "eval/aime24/mean@16", "eval/aime24/pass@2", "eval/aime24/pass@16",
        )),
        ("eval_math500", ("eval/math500/greedy/accuracy",)),
    ]


def test_bench_figures_skip_what_eval_accuracy_already_shows_for_one_benchmark():
    # one benchmark, greedy only: eval/arith/greedy/accuracy == eval/accuracy -> no extra figure
    keys = {"eval/accuracy", "eval/arith/accuracy", "eval/arith/greedy/accuracy", "eval/arith/wrong_frac"}
    assert bench_figures(keys) == []
    # one benchmark, sampling only: mean@4 is the headline, pass@k still gets drawn
    specs = bench_figures({"eval/accuracy", "eval/gsm8k/mean@4", "eval/gsm8k/pass@1", "eval/gsm8k/pass@4"})
    assert [spec.panels for spec in specs] == [("eval/gsm8k/pass@1", "eval/gsm8k/pass@4")]


def test_every_metric_gets_a_png_against_step_time_and_generated_tokens(compared, out_of):
    root, stdout, _, _ = compared
    out = out_of(root)
    pngs = sorted(path.name for path in out.glob("*.png"))
    assert pngs == sorted(f"{spec.slug}_vs_{x}.png" for spec in FIGURES for x in ("step", "time", "tokens"))
    assert all((out / name).stat().st_size > 15_000 for name in pngs)
    assert "wrote 24 figures" in stdout


def test_runs_without_generated_token_counts_get_no_tokens_figure(tmp_path):
    # a run from before the trainer logged tokens/generated_total: step and time figures only
    run = Run("old", {}, [{"step": 1.0, "time/elapsed_s": 5.0, "eval/accuracy": 0.5}])
    groups = {"all runs": [run]}
    eval_figure = next(spec for spec in FIGURES if spec.slug == "eval_accuracy")
    assert plot_figure(eval_figure, groups, group_colours(groups), "time", "ci", tmp_path / "time.png")
    assert not plot_figure(eval_figure, groups, group_colours(groups), "tokens", "ci", tmp_path / "tokens.png")
    assert not (tmp_path / "tokens.png").exists()


def test_isolated_points_are_the_banded_ones_without_banded_neighbours():
    banded = np.array([True, False, True, True, False, True, False])
    assert isolated(banded).tolist() == [True, False, False, False, False, True, False]
    assert isolated(np.array([True])).tolist() == [True]
    assert isolated(np.array([False, False])).tolist() == [False, False]


def test_banded_points_without_banded_neighbours_get_an_interval_bar():
    # steps 5 and 15 have a band, 10 none (one run there): the band cannot fill around 5 or 15, so both get a bar
    axes = Figure().subplots()
    xs, mean = np.array([5.0, 10.0, 15.0]), np.array([0.5, 0.4, 0.6])
    low, high = np.array([0.3, np.nan, 0.55]), np.array([0.7, np.nan, 0.62])
    draw_group(axes, xs, mean, low, high, "#1f77b4", alpha=0.1)
    (bars,) = axes.containers
    assert isinstance(bars, ErrorbarContainer)
    segments = bars.lines[2][0].get_segments()
    assert np.allclose(segments, [[[5.0, 0.3], [5.0, 0.7]], [[15.0, 0.55], [15.0, 0.62]]])
    # a band drawn as an area gets no bar
    axes = Figure().subplots()
    draw_group(axes, xs, mean, mean - 0.1, mean + 0.1, "#1f77b4", alpha=0.1)
    assert not axes.containers

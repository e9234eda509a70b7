from tokenpo.compare.plots import FIGURES, bench_figures, group_colours


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


def test_every_metric_gets_a_png_against_step_and_time(compared):
    root, stdout, _, _ = compared
    out = root / "compare"
    pngs = sorted(path.name for path in out.glob("*.png"))
    assert pngs == sorted(f"{spec.slug}_vs_{x}.png" for spec in FIGURES for x in ("step", "time"))
    assert all((out / name).stat().st_size > 15_000 for name in pngs)
    assert "wrote 14 figures" in stdout

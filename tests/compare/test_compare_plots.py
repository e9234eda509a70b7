from tokenpo.compare.plots import FIGURES, bench_figures, group_colours


def test_group_colours_do_not_depend_on_order():
    labels = ["algorithm=grpo", "algorithm=dapo", "algorithm=tepo"]
    colours = group_colours(labels)
    assert colours == group_colours(reversed(labels))
    assert len(set(colours.values())) == 3
    # sorted order picks tab10's first colours: dapo blue, grpo orange
    assert colours["algorithm=dapo"] == "#1f77b4" and colours["algorithm=grpo"] == "#ff7f0e"


def test_bench_figures_only_for_per_benchmark_eval_keys():
    specs = bench_figures({"eval/accuracy", "eval/aime24/pass@1", "accuracy"})
    assert [(spec.slug, spec.panels) for spec in specs] == [("eval_aime24_pass_1", ("eval/aime24/pass@1",))]


def test_every_metric_gets_a_png_against_step_and_time(compared):
    root, stdout, _, _ = compared
    out = root / "compare"
    pngs = sorted(path.name for path in out.glob("*.png"))
    assert pngs == sorted(f"{spec.slug}_vs_{x}.png" for spec in FIGURES for x in ("step", "time"))
    assert all((out / name).stat().st_size > 15_000 for name in pngs)
    assert "wrote 14 figures" in stdout

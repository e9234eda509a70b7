"""The figures behind the docs' corrected readings (docs/records/docs.md), recomputed from the committed per-run data:

    .venv/bin/python scripts/recompute_claims.py

1. entropy study: how much of each group's step-8 gain had arrived at the first evaluation (step 2)
   (docs/data/entropy_study_curves.csv);
2. main job: the gain by step 10 against the gain by step 30 in the four runs of docs/results.md (the fourth run's
   evaluated steps from docs/data/main_job.csv, the other three as its table prints them: their data were not kept);
3. the update's FLOP/s against the matmul peak at the model's own mix of shapes (docs/data/bench/main_after_r*.json,
   roofline_1thread.json);
4. entropy study: the size of each Holm family, and every test of the study pooled into one family
   (docs/data/entropy_study.csv).
"""

from __future__ import annotations

import csv
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from export_study_data import read_column  # noqa: E402  (the script beside this one)

from tokenpo.compare.significance import holm_adjust, paired_t_test  # noqa: E402

DATA = Path(__file__).resolve().parents[1] / "docs" / "data"


def gain_at_first_evaluation() -> None:
    curves: dict[tuple[str, str], dict[int, float]] = defaultdict(dict)
    with (DATA / "entropy_study_curves.csv").open() as handle:
        for row in csv.DictReader(handle):
            curves[(row["group"], row["seed"])][int(row["step"])] = float(row["held_out"])
    print("1. entropy study: held-out accuracy at steps 0, 2 and 8 (group means), and the share of the step-8 gain "
          "reached at step 2")
    groups = sorted({group for group, _ in curves})
    under_half = 0
    for group in groups:
        runs = [steps for (g, _), steps in curves.items() if g == group]
        start, first, last = (statistics.mean(run[step] for run in runs) for step in (0, 2, 8))
        share = (first - start) / (last - start)
        under_half += share < 0.5
        below = " (below the untrained score)" if first < start else ""
        print(f"   {group:38s} {start:.3f} -> {first:.3f} -> {last:.3f}: {share:+.0%} of the gain at step 2{below}")
    # a run that gained nothing by step 8 has had none of its gain at step 2
    shares = [(run[2] - run[0]) / (run[8] - run[0]) if run[8] != run[0] else 0.0 for run in curves.values()]
    print(f"   groups under half of their gain at step 2: {under_half} of {len(groups)}; runs: "
          f"{sum(share < 0.5 for share in shares)} of {len(shares)}, median run {statistics.median(shares):.0%}")


# docs/results.md, the main job's table: held-out accuracy before, at step 10 and at step 30 (64 problems)
MAIN_JOB_TABLE = {"first run": (46.9, 65.6, 75.0), "re-run, same machine": (46.9, 59.4, 73.4),
                  "re-run, another machine": (46.9, 59.4, 76.6), "re-run, 1 thread (data committed)": (46.9, 60.9, 71.9)}


def main_job_gain_by_step_10() -> None:
    with (DATA / "main_job.csv").open() as handle:
        committed = {int(row["step"]): 100 * float(row["held_out"]) for row in csv.DictReader(handle)}
    assert round(committed[10], 1) == MAIN_JOB_TABLE["re-run, 1 thread (data committed)"][1], committed
    print("2. main job: points gained by step 10 of those gained by step 30")
    for run, (before, at_10, at_30) in MAIN_JOB_TABLE.items():
        share = (at_10 - before) / (at_30 - before)
        print(f"   {run:34s} {at_10 - before:4.1f} of {at_30 - before:4.1f} points: {share:.0%}")


def update_against_the_matmul_peak() -> None:
    roofline = json.loads((DATA / "bench" / "roofline_1thread.json").read_text())
    rates = roofline["matmul_at_model_shapes_gflops_per_s"]
    hidden, intermediate, vocab = (roofline["generation"]["shape"][k] for k in ("hidden", "intermediate", "vocab"))
    # SmolLM2-135M: 30 layers; q and o are [h, h], k and v [h, h/3] (3 key-value heads), gate and up [h, i], down [i, h]
    layers, kv = 30, hidden // 3
    attention = 2 * hidden * hidden + 2 * hidden * kv
    seconds_per_decoder_flop = (attention / rates["attention_projection"] + 2 * hidden * intermediate / rates["mlp_up"]
                                + intermediate * hidden / rates["mlp_down"]) / (attention + 3 * hidden * intermediate)
    print("3. the update's useful FLOP/s against torch.mm at the model's shapes, 1 thread")
    print(f"   the page's peak, {rates['weighted']:.1f} GFLOP/s, weighs one matmul of each shape by its FLOPs: the "
          f"output layer's are {hidden * vocab / (hidden * vocab + hidden * hidden + 2 * hidden * intermediate):.0%}")
    for name in ("main_after_r1.json", "main_after_r2.json"):
        bench = json.loads((DATA / "bench" / name).read_text())["tokenpo"]
        steps = [step for run in bench["runs"] for step in run["steps"][1:]]
        decoder = sum(2 * layers * (attention + 3 * hidden * intermediate) * (s["prompt_tokens"] + s["completion_tokens"])
                      for s in steps)
        head = sum(2 * hidden * vocab * s["completion_tokens"] for s in steps)
        peak = (decoder + head) / (decoder * seconds_per_decoder_flop + head / rates["output_layer"])
        achieved = bench["update_gflops_per_s"]
        print(f"   {name}: output layer {head / (decoder + head):.0%} of the update's FLOPs; peak at this mix "
              f"{peak:.1f} GFLOP/s; update {achieved:.1f} GFLOP/s = {achieved / peak:.0%} of it "
              f"({achieved / rates['weighted']:.0%} of the page's peak)")


def holm_families() -> None:
    print("4. entropy study: tests per Holm family (a group with no spread against the baseline is not tested), "
          "and all of them pooled")
    pooled = {}
    for column in ("held_out", "transfer", "entropy"):
        values = read_column(DATA / "entropy_study.csv", column)
        for baseline in ("algorithm=grpo", "algorithm=dapo"):
            tested = 0
            for group, by_seed in values.items():
                if group == baseline:
                    continue
                seeds = sorted(set(by_seed) & set(values[baseline]))
                test = paired_t_test([by_seed[s] for s in seeds], [values[baseline][s] for s in seeds])
                if test:
                    tested += 1
                    pooled[(column, baseline, group)] = test.p
            print(f"   {column:8s} against {baseline}: {tested} tests")
    adjusted = dict(zip(pooled, holm_adjust(list(pooled.values()))))
    key = ("entropy", "algorithm=dapo", "experiment=entropy/entropy_top")
    column = [k for k in pooled if k[:2] == key[:2]]
    in_column = dict(zip(column, holm_adjust([pooled[k] for k in column])))
    print(f"   80/20 entropy - DAPO: p = {pooled[key]:.4f}, Holm over its column's {len(column)} tests "
          f"{in_column[key]:.3f}, Holm over all {len(pooled)} tests {adjusted[key]:.3f}; tests significant after "
          f"pooling: {sum(p < 0.05 for p in adjusted.values())}")


def main() -> int:
    gain_at_first_evaluation()
    main_job_gain_by_step_10()
    update_against_the_matmul_peak()
    holm_families()
    return 0


if __name__ == "__main__":
    sys.exit(main())

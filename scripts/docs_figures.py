"""The docs site's figures, drawn from committed data (docs/figures/*.png):

    .venv/bin/python scripts/docs_figures.py             # every figure
    .venv/bin/python scripts/docs_figures.py --plans     # also recompute docs/data/memory_plans.json first

- main_job.png: the committed main-job run (docs/data/main_job/metrics.jsonl): held-out accuracy, training reward
  and entropy against step;
- entropy_study_steps.png: the entropy study's held-out accuracy at every evaluated step, each seed and the group
  mean, against the untrained score (docs/data/entropy_study_curves.csv);
- async_study_steps.png: the same for the generation-ahead study (docs/data/async_study_curves.csv);
- memory_plan.png: the memory plan's parts per process for the setups of the getting-started pages
  (docs/data/memory_plans.json, what `python -m tokenpo.plan <overrides> --json` prints for each; `--plans`
  recomputes it).
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from docs_reference import plan_output  # noqa: E402  (the script beside this one)

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "docs" / "data"
FIGURES = REPO / "docs" / "figures"
PLANS = DATA / "memory_plans.json"
# (label, the overrides and flags of `python -m tokenpo.plan`): the getting-started pages' setups
PLAN_SETUPS = (
    ("main job, CPU (laptop)", ["--device", "cpu", "--prompt-tokens", "53"]),
    ("Qwen2.5-Math-1.5B GRPO, 1 x 80 GiB", ["model=qwen2_5_math_1_5b", "data=math", "eval=math500",
                                          "deepspeed.precision=bf16", "rollout.group_size=8",
                                          "data.prompts_per_step=16", "rollout.max_new_tokens=2048",
                                          "data.max_prompt_tokens=512", "trainer.micro_batch_size=8",
                                          "--device-memory", "80GiB"]),
    ("DAPO, Qwen2.5-Math-7B, 8 x 80 GiB", ["experiment=paper/dapo_qwen2_5_math_7b", "--device-memory", "80GiB"]),
    ("GRPO, Qwen2.5-Math-7B, 8 x 80 GiB", ["experiment=paper/grpo_qwen2_5_math_7b", "--device-memory", "80GiB"]),
)


def main_job() -> None:
    rows = [json.loads(line) for line in (DATA / "main_job" / "metrics.jsonl").read_text().splitlines() if line]
    evals = [(row["step"], row["eval/accuracy"]) for row in rows if "eval/accuracy" in row]
    steps = [row for row in rows if "reward/mean" in row]
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.2))
    axes[0].plot(*zip(*evals), marker="o")
    axes[0].set(title="held-out accuracy (64 problems)", xlabel="step", ylim=(0, 1))
    axes[1].plot([r["step"] for r in steps], [r["reward/mean"] for r in steps])
    axes[1].set(title="training reward (8 prompts x 4)", xlabel="step", ylim=(0, 1))
    axes[2].plot([r["step"] for r in steps], [r["entropy/mean"] for r in steps])
    axes[2].set(title="entropy (nats per token)", xlabel="step", ylim=(0, None))
    fig.suptitle("The main job: GRPO on SmolLM2-135M-Instruct, one run (1 thread)", fontsize=10)
    save(fig, "main_job.png")


def curves(path: Path) -> dict[str, dict[str, dict[int, float]]]:
    """{group: {seed: {step: held-out accuracy}}} of a study's every-evaluation CSV."""
    out: dict[str, dict[str, dict[int, float]]] = defaultdict(lambda: defaultdict(dict))
    with path.open() as handle:
        for row in csv.DictReader(handle):
            out[row["group"]][row["seed"]][int(row["step"])] = float(row["held_out"])
    return out


def study_steps(source: str, name: str, title: str, columns: int) -> None:
    groups = curves(DATA / source)
    untrained = next(iter(next(iter(groups.values())).values()))[0]
    rows = -(-len(groups) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(3 * columns, 2.4 * rows), sharex=True, sharey=True,
                             squeeze=False)
    for ax, (group, seeds) in zip(axes.flat, sorted(groups.items())):
        for by_step in seeds.values():
            ax.plot(sorted(by_step), [by_step[s] for s in sorted(by_step)], color="0.75", linewidth=0.8)
        steps = sorted(set.intersection(*(set(by_step) for by_step in seeds.values())))
        ax.plot(steps, [sum(by_step[s] for by_step in seeds.values()) / len(seeds) for s in steps], marker="o",
                color="C0")
        ax.axhline(untrained, color="C3", linestyle="--", linewidth=0.8)
        ax.set_title(group.split("=", 1)[1], fontsize=9)
    for ax in axes.flat[len(groups):]:
        ax.set_visible(False)
    for ax in axes[-1]:
        ax.set_xlabel("step")
    for ax in axes[:, 0]:
        ax.set_ylabel("held-out accuracy")
    fig.suptitle(title, fontsize=10)
    save(fig, name)


def plan_json(arguments: list[str]) -> dict:
    """What `python -m tokenpo.plan <arguments> --json` prints (this checkout's paths written relative to it)."""
    return json.loads(plan_output(" ".join([*arguments, "--json"])))


def plans() -> list[dict]:
    """The memory plans of PLAN_SETUPS as the code computes them now (tests/docs compares them with PLANS)."""
    return [{"setup": label, "command": " ".join(["python -m tokenpo.plan", *arguments]), "plan": plan_json(arguments)}
            for label, arguments in PLAN_SETUPS]


def write_plans() -> None:
    PLANS.write_text(json.dumps(plans(), indent=1) + "\n")


def memory_plan() -> None:
    plans = json.loads(PLANS.read_text())
    names = []
    for entry in plans:
        names += [name for name in entry["plan"]["parts"] if name not in names]
    colours = {name: plt.cm.tab20(i % 20) for i, name in enumerate(names)}
    fig, axes = plt.subplots(len(plans), 1, figsize=(10, 1.55 * len(plans) + 0.6))
    for ax, entry in zip(axes, plans):
        parts = entry["plan"]["parts"]
        for row, phase in enumerate(("update", "generation")):
            left = 0.0
            for name in names:
                part = parts.get(name)
                if part is None or part["phase"] not in ("always", phase) or not part["bytes"]:
                    continue
                width = part["bytes"] / 2**30
                ax.barh(row, width, left=left, color=colours[name], edgecolor="white", linewidth=0.5,
                        label=name)
                left += width
        device = entry["plan"]["device_memory_bytes"]
        if device:
            ax.axvline(device / 2**30, color="k", linestyle="--", linewidth=0.8)
        ax.set_yticks([0, 1], ["update", "generation"], fontsize=8)
        ax.set_title(f"{entry['setup']}: {entry['plan']['total_bytes'] / 2**30:.1f} GiB per process at the "
                     f"{entry['plan']['peak_phase']} phase", fontsize=9)
        ax.tick_params(axis="x", labelsize=8)
    axes[-1].set_xlabel("GiB per process (dashed: the device's memory)")
    handles = {name: plt.Rectangle((0, 0), 1, 1, color=colour) for name, colour in colours.items()}
    fig.legend(handles.values(), handles.keys(), loc="lower center", ncol=4, fontsize=7, frameon=False,
               bbox_to_anchor=(0.5, -0.01))
    fig.tight_layout(rect=(0, 0.09, 1, 1))
    save(fig, "memory_plan.png", tight=False)


def save(fig, name: str, tight: bool = True) -> None:
    FIGURES.mkdir(parents=True, exist_ok=True)
    if tight:
        fig.tight_layout()
    # no timestamp or software version in the file: the same data give the same bytes
    fig.savefig(FIGURES / name, dpi=110, metadata={"Software": None})
    plt.close(fig)
    print(f"docs/figures/{name}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plans", action="store_true", help="recompute docs/data/memory_plans.json first")
    args = parser.parse_args(argv)
    if args.plans or not PLANS.is_file():
        write_plans()
    main_job()
    study_steps("entropy_study_curves.csv", "entropy_study_steps.png",
                "Entropy study: held-out accuracy at each evaluation, 5 seeds (grey) and their mean; dashed: untrained",
                columns=4)
    study_steps("async_study_curves.csv", "async_study_steps.png",
                "Generation ahead: held-out accuracy at each evaluation, 5 seeds (grey) and their mean; "
                "dashed: untrained", columns=3)
    memory_plan()
    return 0


if __name__ == "__main__":
    sys.exit(main())

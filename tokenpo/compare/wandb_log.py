"""Optional upload of the comparison (figures and summary table) as one W&B run."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from tokenpo.compare.table import GroupSummary, summary_columns


def log_comparison(figures: list[Path], summaries: list[GroupSummary], project: str, group: str) -> None:
    # imported here: only --wandb needs wandb; wandb.init itself honours WANDB_MODE (online/offline/disabled)
    import wandb

    run = wandb.init(project=project, group=group, job_type="compare", name=f"compare-{group}")
    table = wandb.Table(columns=summary_columns(), data=[list(dataclasses.astuple(s)) for s in summaries])
    run.log({"summary": table, **{path.stem: wandb.Image(str(path)) for path in figures}})
    run.finish()

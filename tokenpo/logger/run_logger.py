"""Per-step metrics to `<run_dir>/metrics.jsonl`, W&B and a one-line console summary (rank 0 only)."""

from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING

from tokenpo.logger.config import LoggerConfig
from tokenpo.logger.console import Parameters, final_values, parameter_counts, run_header, step_line
from tokenpo.logger.wandb_files import offline_steps

if TYPE_CHECKING:
    from tokenpo.trainer import RunIdentity

log = logging.getLogger("tokenpo")

SAMPLES_FILE = "samples.jsonl"


def wandb_mode(cfg: LoggerConfig) -> str:
    """`auto` is online only where an API key is configured, so fresh machines never hang on a login."""
    if cfg.mode != "auto":
        return cfg.mode
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"]
    has_key = bool(os.environ.get("WANDB_API_KEY")) or (Path.home() / ".netrc").is_file()
    return "online" if has_key else "offline"


def samples_due(cfg: LoggerConfig, step: int) -> bool:
    """A table of training rollouts at this step (evaluations log theirs whenever samples are on)."""
    return bool(cfg.samples_every) and step % cfg.samples_every == 0


def _finite(value):
    return value if not isinstance(value, float) or math.isfinite(value) else None


def read_rows(path: Path) -> list[dict]:
    """The records of a metrics.jsonl in file order; a line cut short by a killed process is skipped."""
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


class RunLogger:
    """The run's metrics and sample tables, for `identity` (its run dir, names and config); `enabled` on rank 0;
    `resume_id`: the W&B run a resumed run continues."""

    def __init__(self, cfg: LoggerConfig, identity: RunIdentity, *, enabled: bool, resume_id: str | None = None):
        run_dir = identity.run_dir
        self.cfg = cfg
        self.enabled = enabled
        self.config = identity.config  # the resolved run config: the header and summary.json read it
        self.max_steps = (identity.config.get("trainer") or {}).get("max_steps")
        self.last: dict = {}  # the last training step's metrics (summary.json's final values)
        self.parameters: Parameters | None = None
        self.path = run_dir / "metrics.jsonl"
        self.samples_path = run_dir / SAMPLES_FILE
        self.wandb_run = None
        if not enabled:
            return
        mode = wandb_mode(cfg)
        if mode != "disabled":
            import wandb

            self.wandb_run = wandb.init(
                project=cfg.project, entity=cfg.entity, group=cfg.group or identity.group,
                name=cfg.name or identity.name, tags=list(cfg.tags), config=identity.config, dir=str(run_dir),
                mode=mode, id=resume_id, resume="allow" if resume_id else None,
            )
            if resume_id:
                self.relog_missing(self.wandb_held_steps(run_dir, mode))

    @property
    def wandb_id(self) -> str | None:
        return self.wandb_run.id if self.wandb_run is not None else None

    def wandb_held_steps(self, run_dir: Path, mode: str) -> set[int]:
        """The steps the resumed W&B run holds already: an online run's server says where it stands; an offline
        run's earlier attempts are read back from their files under `<run_dir>/wandb/`."""
        if mode == "offline":
            return offline_steps(run_dir / "wandb", self.wandb_run.id)
        return set(range(self.wandb_run.starting_step))

    def relog_missing(self, held: set[int]) -> None:
        """Log to W&B again the rows of metrics.jsonl that it lacks. A killed process loses the steps W&B had not
        written yet, while metrics.jsonl (written first, synchronously) and the checkpoint cover them."""
        rows = [row for row in read_rows(self.path) if row["step"] not in held]
        for row in rows:
            # non-finite values were stored as null; W&B gets the finite ones
            self.wandb_run.log({k: v for k, v in row.items() if k != "step" and v is not None}, step=row["step"])
        if rows:
            log.info("W&B run %s lacked %d step(s) of metrics.jsonl (%s): logged them again", self.wandb_run.id,
                     len(rows), ", ".join(str(row["step"]) for row in rows))

    def log(self, step: int, metrics: dict) -> None:
        if not self.enabled:
            return
        record = {"step": step, **{k: _finite(v) for k, v in sorted(metrics.items())}}
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")
        if self.wandb_run is not None:
            self.wandb_run.log(metrics, step=step)
        if step:
            self.last = dict(metrics)
        if step % self.cfg.console_every == 0 or "eval/accuracy" in metrics:
            log.info("%s", step_line(step, self.max_steps, metrics))

    def describe_run(self, module) -> None:
        """The run's header line (algorithm, seed, parameters trained / total, LoRA, batch, checkpoints), logged
        once at the start; the parameter counts go to summary.json too."""
        self.parameters = parameter_counts(module)
        if self.enabled:
            log.info("%s", run_header(self.config, self.parameters))

    def outcome(self) -> dict:
        """What summary.json adds to the run's state: the algorithm, seed, parameters and the last step's values."""
        algorithm = (self.config.get("algorithm") or {}).get("name")
        summary = {"algorithm": algorithm, "seed": self.config.get("seed"), "max_steps": self.max_steps}
        if self.parameters is not None:
            summary.update(parameters=self.parameters.total, trained_parameters=self.parameters.trained,
                           lora_rank=((self.config.get("model") or {}).get("lora") or {}).get("rank", 0))
        return {**summary, **final_values(self.last)}

    def log_samples(self, step: int, table: str, rows: list[dict]) -> None:
        """`rows` (tokenpo.logger.samples) as the W&B table samples/<table> at `step`, and appended to samples.jsonl
        with `table` in each row; nothing when logger.samples_every is 0."""
        if not self.enabled or not self.cfg.samples_every or not rows:
            return
        with open(self.samples_path, "a") as f:
            f.writelines(json.dumps({"table": table, **row}) + "\n" for row in rows)
        if self.wandb_run is not None:
            import wandb

            columns = list(rows[0])
            data = [[row[column] for column in columns] for row in rows]
            self.wandb_run.log({f"samples/{table}": wandb.Table(columns=columns, data=data)}, step=step)

    def alert(self, title: str, text: str, error: bool = False) -> None:
        """`text` as one warning line (rank 0), and as a W&B alert when W&B logs (wandb.alert: e-mail or Slack as the
        user's W&B settings say)."""
        if not self.enabled:
            return
        log.warning(text)
        if self.wandb_run is not None:
            import wandb

            level = wandb.AlertLevel.ERROR if error else wandb.AlertLevel.WARN
            self.wandb_run.alert(title=title, text=text, level=level)

    def finish(self) -> None:
        if self.wandb_run is not None:
            self.wandb_run.finish()

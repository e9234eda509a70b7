"""Sweeps (`-m`) that resume, the value a job returns to its sweeper, and how a parallel sweep shares the CPU.

Rerunning an interrupted sweep's command (same `hydra.sweep.dir`) runs each job into the run dir it had before:
- a job whose run dir holds a finished run of the same overrides is skipped ("skipped: finished"), nothing written;
- a job with a checkpoint of the same overrides resumes from it (`trainer.resume=auto`, as a single run does);
- any other job starts; what an earlier run with other overrides left there is set aside (`rundir`), never resumed.
`trainer.resume=none` forces a fresh sweep: every job starts again, earlier results set aside.
The sweep dir's own files (multirun.yaml, Optuna's optimization_results.yaml) follow the run-dir rule: a start that
would write different contents moves the earlier ones aside first (`SweepDirFiles`, a Hydra callback).
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from tokenpo.errors import ConfigError
from tokenpo.evaluation.metrics import metric_names
from tokenpo.logger.run_logger import read_rows

log = logging.getLogger("tokenpo")

# the job's overrides as its first start recorded them (tokenpo.train.start_run_dir)
OVERRIDES_FILE = Path(".hydra") / "overrides.yaml"
# files a sweeper writes into the sweep dir itself
SWEEP_FILES = ("multirun.yaml", "optimization_results.yaml")


def recorded_overrides(run_dir: Path) -> list[str] | None:
    path = run_dir / OVERRIDES_FILE
    return list(OmegaConf.load(path)) if path.is_file() else None


def same_job(run_dir: Path, overrides: list[str], is_control) -> bool | None:
    """Whether the run in `run_dir` was started with `overrides` (those for which `is_control` holds, the ones that
    say how a job runs, left out on both sides); None when the run dir records none."""
    recorded = recorded_overrides(run_dir)
    if recorded is None:
        return None
    return sorted(o for o in recorded if not is_control(o)) == sorted(o for o in overrides if not is_control(o))


def finished_summary(run_dir: Path, max_steps: int) -> dict | None:
    """summary.json of a run in `run_dir` that trained all `max_steps` steps and was not interrupted, else None."""
    path = run_dir / "summary.json"
    try:
        summary = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    done = summary.get("steps") == max_steps and not summary.get("interrupted")
    return summary if done else None


def objective_value(run_dir: Path, key: str | None) -> float | None:
    """`key` at the last logged step of the run's metrics.jsonl (None without a key or when that step lacks it)."""
    rows = read_rows(run_dir / "metrics.jsonl") if key else []
    if not rows:
        return None
    value = rows[-1].get(key)
    return None if value is None else float(value)


def loggable_objectives(cfg) -> list[str]:
    """The metrics a run with this config logs at its last step that can be a sweep's objective: every benchmark's
    evaluation metrics (eval/<name>/<metric>, and eval/accuracy for the main one)."""
    names = ["eval/accuracy"] if cfg.eval.benchmarks() else []
    for bench in cfg.eval.benchmarks():
        names += [f"eval/{bench.name}/{metric}" for metric in metric_names(bench)]
    return names


def check_objective(cfg) -> None:
    """trainer.objective names a metric this run logs at its last step (one line before any job starts)."""
    key = cfg.trainer.objective
    if key is None:
        return
    names = loggable_objectives(cfg)
    if key not in names:
        raise ConfigError(f"trainer.objective={key}: this run logs no such metric at its last step "
                          f"(available: {', '.join(names) or 'none: no benchmark is evaluated'})")


def job_threads(launcher: DictConfig, nproc: int) -> int:
    """Intra-op threads per process for a job that leaves `trainer.threads` at 0 under a launcher that runs jobs side
    by side: the CPU cores split between joblib's n_jobs jobs and each job's processes, or submitit's
    cpus_per_task; 0 (torch's default) under other launchers."""
    if launcher.get("n_jobs") is not None:  # joblib: negative counts back from the cores, as joblib does
        cores = os.cpu_count() or 1
        jobs = launcher.n_jobs if launcher.n_jobs > 0 else max(1, cores + 1 + launcher.n_jobs)
        return max(1, cores // jobs // nproc)
    return launcher.get("cpus_per_task") or 0


def restore_start_method() -> None:
    """In a joblib (loky) worker multiprocessing's start method is 'loky', which a spawned child (a reward worker)
    cannot look up when it starts: the job's own children get the platform's default back."""
    if multiprocessing.get_start_method(allow_none=True) not in multiprocessing.get_all_start_methods():
        multiprocessing.set_start_method(None, force=True)


class SweepDirFiles(Callback):
    """Before a sweep writes its sweep dir's own files: earlier ones that this start would change are moved into
    `<sweep dir>/sweep.previous-<time>/` (one log line); identical ones (the same command again) stay."""

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        new_multirun = OmegaConf.to_yaml(config)
        earlier = [sweep_dir / name for name in SWEEP_FILES if (sweep_dir / name).is_file()]
        changed = [path for path in earlier if path.name != "multirun.yaml" or path.read_text() != new_multirun]
        if changed:
            # imported here: the run-dir module imports torch, which a sweep's launching process does not need
            from tokenpo.trainer.harness.rundir import move_aside

            folder = move_aside(changed, sweep_dir / "sweep")
            log.warning("%s held an earlier sweep's %s: moved to %s", sweep_dir,
                        ", ".join(path.name for path in changed), folder)

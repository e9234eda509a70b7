"""Who a run is (torch-free: the command line builds it before any check that imports torch)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class RunIdentity:
    """Where a run writes and how it is named: the run dir, the W&B run name (its overrides) and group (the sweep
    folder, or 'single'), and the resolved config it logs."""

    run_dir: Path
    name: str
    group: str
    config: dict  # the composed tree, resolved (OmegaConf.to_container): what W&B shows as the run's config

"""The RL training loop (config group `trainer`), in three layers, each importing only those below it:

- `tokenpo.trainer.core`: one step (`step.train_step`: rollouts from the source, the update through the policy), the
  batch record (`batch.RolloutBatch`), the policy (`policy.Policy`: the one door weights leave by), the source of
  rollouts over a generator (`source.RolloutSource`);
- `tokenpo.trainer.harness`: the run around the steps (`loop.train`): resume and checkpoints, health checks, held-out
  evaluation, the run folder, stop signals;
- `tokenpo.trainer.processes`: the processes a job starts (local workers, Slurm and submitit environments, sweeps).

Other packages import what they use from this facade (or the config schema, tokenpo.trainer.config), never a layer's
module: the names below, loaded when first used (importing tokenpo.trainer imports neither torch nor DeepSpeed).
"""

from __future__ import annotations

import importlib

# public name -> the module that defines it
PUBLIC = {
    # the step core
    "Policy": "core.policy", "StepSettings": "core.step", "train_step": "core.step", "update_policy": "core.step",
    "collect_rollouts": "core.step", "RolloutBatch": "core.batch", "pad_groups": "core.batch",
    "StepRollouts": "core.rollouts", "rollout_batch": "core.rollouts", "Timings": "core.timings",
    # the run harness
    "train": "harness.loop", "RunIdentity": "harness.identity", "check_adapters": "harness.checkpoint",
    "resume_dir_on_disk": "harness.checkpoint", "ENVIRONMENT_FILE": "harness.environment",
    "LIBRARIES": "harness.environment", "read_environments": "harness.environment", "rundir": "harness.rundir",
    # the processes a job starts
    "Requeued": "processes.launch", "adopt_slurm_environment": "processes.launch",
    "adopt_submitit_environment": "processes.launch", "external_launcher_argv": "processes.launch",
    "external_world_size": "processes.launch", "local_world_size": "processes.launch",
    "check_local_devices": "processes.launch", "hand_over_stop": "processes.launch",
    "launch_local_workers": "processes.launch", "check_objective": "processes.sweep", "sweep": "processes.sweep",
}

__all__ = sorted(PUBLIC)


def __getattr__(name: str):
    if name not in PUBLIC:
        raise AttributeError(f"module 'tokenpo.trainer' has no attribute {name!r}")
    module = importlib.import_module(f"tokenpo.trainer.{PUBLIC[name]}")
    # a name that is a module (rundir, sweep) is that module itself
    return module if PUBLIC[name].endswith("." + name) else getattr(module, name)

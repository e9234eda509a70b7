"""DeepSpeed ZeRO engines and the process group (config group `deepspeed`)."""

import os


def name_the_accelerator() -> None:
    """Without CUDA tokenpo trains on the CPU (dist.device); naming that accelerator before DeepSpeed is imported
    keeps DeepSpeed from logging "Setting accelerator to CPU ... unable to detect it" as a WARNING on every start.

    Called by the modules that import DeepSpeed, not when this package is: its config schema is read at start-up,
    before torch is imported.
    """
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")

"""DeepSpeed ZeRO engines and the process group (config group `deepspeed`)."""

import os

import torch

# Without CUDA tokenpo trains on the CPU (dist.device); naming that accelerator before DeepSpeed is imported keeps
# DeepSpeed from logging "Setting accelerator to CPU ... unable to detect it" as a WARNING on every start.
if not torch.cuda.is_available():
    os.environ.setdefault("DS_ACCELERATOR", "cpu")

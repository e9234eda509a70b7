"""Process-group helpers: one code path for 1 process, local workers, torchrun and DeepSpeed's launcher."""

from __future__ import annotations

import logging
import os
import socket

import torch
import torch.distributed as dist

from tokenpo.deepspeed import name_the_accelerator

name_the_accelerator()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def init_distributed(backend: str) -> None:
    """Join the launcher's process group; a lone process makes a group of one (DeepSpeed needs one)."""
    if dist.is_initialized():
        return
    if "WORLD_SIZE" not in os.environ:
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(free_port()))
    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    import deepspeed

    # on the CPU DeepSpeed probes its ops by compiling test programs; setuptools logs each gcc command at INFO,
    # which the run's console log would show on every start
    logging.getLogger("compilers").setLevel(logging.WARNING)
    deepspeed.init_distributed(dist_backend=backend, auto_mpi_discovery=False)
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def is_main() -> bool:
    return rank() == 0


def all_gather_objects(obj) -> list:
    """Every rank's `obj`, in rank order (picklable Python objects; token ids, verdicts, small tensors)."""
    if world_size() == 1:
        return [obj]
    out = [None] * world_size()
    dist.all_gather_object(out, obj)
    return out


def broadcast_object(obj):
    """Rank 0's `obj` on every rank."""
    if world_size() == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")

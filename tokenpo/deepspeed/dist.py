"""Process-group helpers: one code path for 1 process, local workers, torchrun and DeepSpeed's launcher."""

from __future__ import annotations

import logging
import os
import socket
from datetime import timedelta

import torch
import torch.distributed as dist
from packaging import version

from tokenpo.deepspeed import name_the_accelerator
from tokenpo.errors import ConfigError
from tokenpo.deepspeed.config import COLLECTIVE_TIMEOUT_S

name_the_accelerator()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def local_device_index(local_rank: int, visible: int) -> int:
    """This process's CUDA device among the `visible` ones: LOCAL_RANK where every process of the node sees all of
    them (torchrun, tokenpo's workers, submitit), 0 where each task sees exactly one (Slurm's --gpus-per-task=1)."""
    if local_rank < visible:
        return local_rank
    if visible == 1:
        return 0
    raise ConfigError(f"LOCAL_RANK={local_rank} but this process sees {visible} CUDA devices (CUDA_VISIBLE_DEVICES): "
                      "give every process of a node all of its devices, or each process exactly one")


def bound_device(index: int, world_size: int, backend: str) -> torch.device | None:
    """The device NCCL binds its communicator to at init (init_process_group's device_id), as DeepSpeed's own
    TorchBackend decides it: NCCL only, not for a group of one (torch then splits every new group from a communicator
    no peer joins; deepspeed#8248), and not on torch releases after 2.6.0 and before 2.7.1, where it hangs
    (pytorch#153960)."""
    hangs = version.parse("2.6.0") < version.parse(torch.__version__) < version.parse("2.7.1")
    if backend != "nccl" or world_size == 1 or hangs:
        return None
    return torch.device("cuda", index)


def init_distributed(backend: str, timeout_s: float = COLLECTIVE_TIMEOUT_S) -> None:
    """Join the launcher's process group; a lone process makes a group of one (DeepSpeed needs one).

    The CUDA device is chosen before the group exists, as torchrun's recipe does (set_device, then
    init_process_group(device_id=...)); every collective waits `timeout_s` (trainer.dist_timeout_s) for the slowest
    process."""
    if dist.is_initialized():
        return
    if "WORLD_SIZE" not in os.environ:
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(free_port()))
    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    device_id = None
    if torch.cuda.is_available():
        index = local_device_index(int(os.environ["LOCAL_RANK"]), torch.cuda.device_count())
        torch.cuda.set_device(index)
        # DeepSpeed's engine picks its device by LOCAL_RANK: a task that sees one device names it
        os.environ["LOCAL_RANK"] = str(index)
        device_id = bound_device(index, int(os.environ["WORLD_SIZE"]), backend)
    timeout = timedelta(seconds=timeout_s)
    # ours, not DeepSpeed's: its TorchBackend binds device LOCAL_RANK, which a one-device task does not have; it joins
    # the group that exists
    dist.init_process_group(backend, timeout=timeout, device_id=device_id)
    import deepspeed

    # on the CPU DeepSpeed probes its ops by compiling test programs; setuptools logs each gcc command at INFO,
    # which the run's console log would show on every start
    logging.getLogger("compilers").setLevel(logging.WARNING)
    deepspeed.init_distributed(dist_backend=backend, auto_mpi_discovery=False, timeout=timeout)


def visible_cuda_devices() -> int:
    """CUDA devices this process can use (0 without CUDA)."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


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


def all_gather_rows(rows: torch.Tensor) -> list[torch.Tensor]:
    """Every rank's 2-D tensor `rows` ([n_r, w_r], any n_r and w_r), in rank order, through tensor all_gathers instead
    of pickling: the shapes first, then each rank's tensor zero-padded to the largest n and w, cut back after. Under
    NCCL the collective runs on this rank's device (NCCL gathers no CPU tensors); the result is on `rows`' device."""
    if world_size() == 1:
        return [rows]
    on = device() if dist.get_backend() == "nccl" else torch.device("cpu")
    shape = torch.tensor(rows.shape, dtype=torch.long, device=on)
    shapes = [torch.empty_like(shape) for _ in range(world_size())]
    dist.all_gather(shapes, shape)
    sizes = [(int(s[0]), int(s[1])) for s in shapes]
    padded = torch.zeros(max(n for n, _ in sizes), max(w for _, w in sizes), dtype=rows.dtype, device=on)
    padded[: rows.shape[0], : rows.shape[1]] = rows
    parts = [torch.empty_like(padded) for _ in range(world_size())]
    dist.all_gather(parts, padded)
    return [part[:n, :w].to(rows.device) for part, (n, w) in zip(parts, sizes)]


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

"""The gloo group the `gloo` weight transfer broadcasts over, the same on both ends: a TCP store at the trainer's rank
0 and a gloo process group of its own (never torch.distributed's default group, which the trainer's DeepSpeed and
the server's vLLM each hold for themselves)."""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist


def gloo_group(address: str, port: int, rank: int, world_size: int, timeout: timedelta) -> dist.ProcessGroupGloo:
    """Rank `rank` of a group of `world_size` meeting at address:port (rank 0 holds the store)."""
    store = dist.TCPStore(address, port, world_size, is_master=rank == 0, timeout=timeout,
                          wait_for_workers=False)
    return dist.ProcessGroupGloo(dist.PrefixStore("tokenpo-weights", store), rank, world_size, timeout)


def broadcast(group: dist.ProcessGroupGloo, tensor: torch.Tensor) -> None:
    """`tensor` from rank 0 to every rank of `group` (in place on the receivers), done when it returns."""
    options = dist.BroadcastOptions()
    options.rootRank = 0
    group.broadcast([tensor], options).wait()

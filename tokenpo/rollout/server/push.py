"""The policy's weights to vLLM servers after each update, through vLLM's weight-transfer API: the trainer's rank 0
opens one group with every worker of every server (`/init_weight_transfer_engine`), and each push pauses generation
as rollout.server.in_flight says (`/pause`), runs `/start_weight_update`, announces the tensors bucket by bucket
(`/update_weights`, answered once the bucket has arrived) while it broadcasts them, then `/finish_weight_update`
labels the weights with their policy version (vLLM tags every token it samples with that label) and `/resume`.

The tensors come from `Published.tensors()`, the policy's one weight door: module by module, a LoRA layer merged,
under ZeRO-3 each module gathered while it is read (a collective: every rank iterates the stream; only rank 0 sends).
The wire is NCCL on GPUs (vLLM's own `nccl` engine on the servers; its communicator on the trainer) and gloo on CPU
(tokenpo.rollout.server.gloo_worker, registered with vLLM as a plugin): the same calls in the same order.
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timedelta
from typing import Protocol

import torch

from tokenpo.models.published import Published
from tokenpo.rollout.server.client import call
from tokenpo.rollout.server.wire import broadcast, gloo_group

CONTROL_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class TransferSetup:
    backend: str  # nccl | gloo
    address: str  # the trainer's rank 0, as the servers reach it
    port: int
    bucket_bytes: int
    timeout_s: float  # a push, and the group's rendezvous


@dataclass(frozen=True)
class PushStats:
    version: int
    mib: float
    seconds: float  # generation paused on the servers from the pause's start to the resume
    drain_s: float  # of which the pause itself: under in_flight=wait, the requests in flight finishing


class Wire(Protocol):
    def send(self, tensor: torch.Tensor) -> None:
        """`tensor` from the trainer (rank 0 of the group) to every server worker."""


class GlooWire:
    def __init__(self, setup: TransferSetup, world_size: int) -> None:
        self.group = gloo_group(setup.address, setup.port, 0, world_size, timedelta(seconds=setup.timeout_s))

    def send(self, tensor: torch.Tensor) -> None:
        broadcast(self.group, tensor.detach().to("cpu").contiguous())


class NcclWire:
    """vLLM's trainer end of its NCCL weight transfer (not yet run on a GPU: docs/gpu.md)."""

    def __init__(self, setup: TransferSetup, world_size: int) -> None:
        from vllm.distributed.weight_transfer.nccl_common import trainer_init

        self.communicator = trainer_init({"master_address": setup.address, "master_port": setup.port,
                                          "world_size": world_size})

    def send(self, tensor: torch.Tensor) -> None:
        self.communicator.broadcast(tensor.detach().contiguous(), src=0, stream=torch.cuda.current_stream())


WIRES = {"gloo": GlooWire, "nccl": NcclWire}


def worker_counts(urls: list[str]) -> list[int]:
    """Each server's workers (tensor x pipeline x data parallel): its ranks in the transfer group."""
    return [int(call(url, "/get_world_size", timeout_s=CONTROL_TIMEOUT_S)["world_size"]) for url in urls]


def init_info(setup: TransferSetup, rank_offset: int, world_size: int) -> dict:
    """What `/init_weight_transfer_engine` takes for `setup.backend` (vLLM's NCCLWeightTransferInitInfo, or
    tokenpo's GlooInitInfo): each server's workers numbered from its rank_offset on."""
    info = {"master_address": setup.address, "master_port": setup.port, "rank_offset": rank_offset,
            "world_size": world_size}
    return {**info, "timeout_s": setup.timeout_s} if setup.backend == "gloo" else {**info, "packed": False}


class WeightPush:
    """The trainer's end of the transfer to `urls` (rank 0 sends; every rank iterates the weights)."""

    def __init__(self, urls: list[str], setup: TransferSetup, sender: bool) -> None:
        self.urls, self.setup, self.sender = urls, setup, sender
        self.pool = ThreadPoolExecutor(max_workers=max(1, len(urls)), thread_name_prefix="tokenpo-push")
        self.wire: Wire | None = None
        if sender:
            self.wire = self._open()

    def _open(self) -> Wire:
        counts = worker_counts(self.urls)
        world = 1 + sum(counts)
        offsets = [1 + sum(counts[:i]) for i in range(len(counts))]
        # the servers' workers wait in the rendezvous until the trainer's end opens: the calls run beside it
        answers = [self.pool.submit(call, url, "/init_weight_transfer_engine",
                                    {"init_info": init_info(self.setup, offset, world)}, timeout_s=self.setup.timeout_s)
                   for url, offset in zip(self.urls, offsets)]
        wire = WIRES[self.setup.backend](self.setup, world)
        wait_all(answers)
        return wire

    def push(self, published: Published, in_flight: str) -> PushStats:
        """Version `published.version` to every server, generation paused around it as `in_flight` says."""
        started = time.perf_counter()
        if self.sender:
            # rollout.server.in_flight's choices are vLLM's pause modes
            self._each("/pause", query={"mode": in_flight})
        drained = time.perf_counter()
        if self.sender:
            self._each("/start_weight_update")
        total, failure = 0, None
        for bucket in buckets(published.tensors(), self.setup.bucket_bytes):
            total += sum(tensor.numel() * tensor.element_size() for _, tensor in bucket)
            if self.sender and failure is None:
                try:
                    self._send(bucket)
                except (OSError, RuntimeError) as error:
                    # the stream is read to its end all the same: under ZeRO-3 each read is a collective
                    failure = error
        if failure is not None:
            raise failure
        if self.sender:
            self._each("/finish_weight_update", {"weight_version": str(published.version)})
            self._each("/resume")
        return PushStats(published.version, total / 2**20, time.perf_counter() - started, drained - started)

    def _send(self, bucket: list[tuple[str, torch.Tensor]]) -> None:
        meta = {"names": [name for name, _ in bucket],
                "dtype_names": [str(tensor.dtype).removeprefix("torch.") for _, tensor in bucket],
                "shapes": [list(tensor.shape) for _, tensor in bucket]}
        # answered once the servers have received the bucket: the calls run beside the broadcasts
        answers = self._to_each("/update_weights", {"update_info": meta})
        for _, tensor in bucket:
            self.wire.send(tensor)
        wait_all(answers)

    def _each(self, route: str, body: dict | None = None, query: dict | None = None) -> None:
        wait_all(self._to_each(route, body, query))

    def _to_each(self, route: str, body: dict | None = None, query: dict | None = None) -> list[Future]:
        """`route` called on every server at once; the calls' futures."""
        return [self.pool.submit(call, url, route, body if body is not None else {}, query=query,
                                 timeout_s=self.setup.timeout_s) for url in self.urls]

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


def wait_all(answers: list[Future]) -> None:
    """Every call's answer; the first failure raised."""
    for answer in answers:
        answer.result()


def buckets(tensors, bucket_bytes: int):
    """(name, tensor) pairs in lists of about `bucket_bytes` (a tensor larger than that alone)."""
    bucket, size = [], 0
    for name, tensor in tensors:
        bucket.append((name, tensor))
        size += tensor.numel() * tensor.element_size()
        if size >= bucket_bytes:
            yield bucket
            bucket, size = [], 0
    if bucket:
        yield bucket


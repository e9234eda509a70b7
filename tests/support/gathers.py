"""What a rank's ZeRO-3 passes gather: every module fetch DeepSpeed's parameter coordinator makes (in the forward and
in the backward; each one all-gathers the module's partitioned parameters that are not already there), every whole-model
gather (`GatheredParameters`: generation, export), and the output layer's chunks, per labelled pass; and what those
fetches cost: the all-gathers of tensors the process group ran (DeepSpeed's parameter gathers, on demand or prefetched,
and its step's) and the elements they moved, and how often DeepSpeed dropped its trace of the module order (without
one it prefetches nothing).

Under ZeRO-3 on several processes every rank must make the same fetches in the same order: a rank that fetches once
more than another waits in a collective the others never join. The parity tests record this on each rank and compare
the records across ranks; the chunk records show that the ranks' lengths really differed and were chunked.
"""

from __future__ import annotations

import contextlib
import os
import sys
from dataclasses import dataclass, field

from deepspeed.runtime.zero import partition_parameters
import deepspeed.comm.comm
from deepspeed.runtime.zero.partitioned_param_coordinator import PartitionedParameterCoordinator

from tokenpo.models import logprobs
# TOKENPO_GATHER_TRACE=1: every fetch also printed to stderr when it happens (to find where two ranks' fetches part)
TRACE = bool(os.environ.get("TOKENPO_GATHER_TRACE"))


@dataclass
class PassRecord:
    """One labelled pass on this rank: `fetches` in order (module class, its ds_id, forward or backward, or
    ("GatheredParameters", parameter count, True)), and the output layer's (tokens, chunks) per call."""

    label: str
    fetches: list[tuple[str, int, bool]] = field(default_factory=list)
    chunks: list[tuple[int, int]] = field(default_factory=list)
    all_gathers: int = 0  # DeepSpeed's all_gather_into_tensor calls (ZeRO-3's parameter gathers)
    gathered_numel: int = 0  # the elements they gathered
    invalidations: int = 0  # times DeepSpeed invalidated its module trace ("Invalidate trace cache")


class GatherLog:
    """The passes recorded while `recording()` is on, each under `pass_(label)`."""

    def __init__(self) -> None:
        self.passes: list[PassRecord] = []
        self._current: PassRecord | None = None

    @contextlib.contextmanager
    def recording(self):
        fetch, enter = PartitionedParameterCoordinator.fetch_sub_module, partition_parameters.GatheredParameters.__enter__
        # DeepSpeed's torch backend keeps the all-gather it calls (torch.distributed.all_gather_into_tensor) as an
        # attribute, taken when it started
        backend = deepspeed.comm.comm.cdb
        all_gather, invalidate = backend.all_gather_function, PartitionedParameterCoordinator._invalidate_trace
        head_chunks = logprobs.head_chunks
        log = self

        def counted_all_gather(*, output_tensor, **kwargs):
            if log._current is not None:
                log._current.all_gathers += 1
                log._current.gathered_numel += output_tensor.numel()
            return all_gather(output_tensor=output_tensor, **kwargs)

        def counted_invalidate(coordinator):
            if log._current is not None:
                log._current.invalidations += 1
            return invalidate(coordinator)

        def recorded_fetch(coordinator, module, forward: bool):
            if log._current is not None:
                log._current.fetches.append((type(module).__name__, module.ds_id, forward))
                if TRACE:  # as it happens: the last lines of two ranks' logs show where they parted
                    print("fetch", log._current.label, type(module).__name__, module.ds_id,
                          "forward" if forward else "backward", file=sys.stderr, flush=True)
            return fetch(coordinator, module, forward)

        def recorded_enter(gathered):
            if log._current is not None and gathered.enabled:
                log._current.fetches.append(("GatheredParameters", len(gathered.params), True))
            return enter(gathered)

        def recorded_chunks(tokens, chunk_tokens, lockstep, device):
            parts = head_chunks(tokens, chunk_tokens, lockstep, device)
            if log._current is not None:
                log._current.chunks.append((tokens, len(parts)))
            return parts

        PartitionedParameterCoordinator.fetch_sub_module = recorded_fetch
        backend.all_gather_function = counted_all_gather
        PartitionedParameterCoordinator._invalidate_trace = counted_invalidate
        partition_parameters.GatheredParameters.__enter__ = recorded_enter
        logprobs.head_chunks = recorded_chunks
        try:
            yield self
        finally:
            PartitionedParameterCoordinator.fetch_sub_module = fetch
            backend.all_gather_function = all_gather
            PartitionedParameterCoordinator._invalidate_trace = invalidate
            partition_parameters.GatheredParameters.__enter__ = enter
            logprobs.head_chunks = head_chunks

    @contextlib.contextmanager
    def pass_(self, label: str):
        self._current = PassRecord(label)
        try:
            yield
        finally:
            self.passes.append(self._current)
            self._current = None

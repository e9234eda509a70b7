"""The server half of the `gloo` weight transfer: a vLLM weight-transfer engine (vLLM's own API,
`vllm.distributed.weight_transfer`) that receives the trainer's weights over a gloo group instead of NCCL.

vLLM ships NCCL and CUDA-IPC transports only, both GPU-only; its factory takes a registered backend, and this is the
one vLLM lacks for CPU servers (and for tests of the GPU path's protocol on CPU). It mirrors vLLM's NCCL engine in
everything but the wire: each `update_weights` chunk names its tensors, the trainer broadcasts them from rank 0 in
that order, and they load through vLLM's layerwise reload (started and finished around the update), which also runs
vLLM's weight post-processing (the CPU backend's repacking). `register` is a vLLM general plugin
(pyproject's `vllm.general_plugins` entry point), so every vLLM process of a machine with tokenpo installed knows
the backend: `vllm serve ... --weight-transfer-config '{"backend": "gloo"}'`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import torch
from vllm.distributed.weight_transfer.base import (
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)

from tokenpo.rollout.server.wire import broadcast, gloo_group

BACKEND = "gloo"


@dataclass
class GlooInitInfo(WeightTransferInitInfo):
    master_address: str  # the trainer's rendezvous (its rank 0 holds the TCP store)
    master_port: int
    rank_offset: int  # this server's first worker rank in the group (the trainer is rank 0)
    world_size: int  # the trainer + every worker of every server
    timeout_s: float


@dataclass
class GlooUpdateInfo(WeightTransferUpdateInfo):
    names: list[str]
    dtype_names: list[str]
    shapes: list[list[int]]


class GlooWeightTransferEngine(WeightTransferEngine[GlooInitInfo, GlooUpdateInfo]):
    init_info_cls = GlooInitInfo
    update_info_cls = GlooUpdateInfo
    supports_draft_weight_update = False

    def init_transfer_engine(self, init_info: GlooInitInfo) -> None:
        parallel = self.parallel_config
        # unique over the data-parallel replicas of this server, as vLLM's NCCL engine numbers its workers
        rank = parallel.data_parallel_index * parallel.world_size + parallel.rank + init_info.rank_offset
        self.group = gloo_group(init_info.master_address, init_info.master_port, rank, init_info.world_size,
                                timedelta(seconds=init_info.timeout_s))

    def start_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        initialize_layerwise_reload(self.model)

    def finish_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        finalize_layerwise_reload(self.model, self.model_config)

    def update_weights(self, update_info: dict) -> None:
        # the base class synchronises the accelerator after the receive: a gloo broadcast is done when it returns,
        # and a CPU server has no accelerator to synchronise
        self.receive_weights(self.parse_update_info(update_info))

    def receive_weights(self, update_info: GlooUpdateInfo) -> None:
        for name, dtype_name, shape in zip(update_info.names, update_info.dtype_names, update_info.shapes):
            tensor = torch.empty(shape, dtype=getattr(torch, dtype_name), device=self.device)
            broadcast(self.group, tensor)
            self.model.load_weights([(name, tensor)])

    def shutdown(self) -> None:
        self.group = None


def register() -> None:
    """vLLM general plugin: the `gloo` backend in vLLM's weight-transfer factory (every vLLM process loads it)."""
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    try:
        WeightTransferEngineFactory.register_engine(BACKEND, __name__, GlooWeightTransferEngine.__name__)
    except ValueError:  # registered already: vLLM loads its plugins once per process, a test may call it again
        pass

"""A stand-in `vllm` module for the vllm engine's tests without vLLM (its CPU build has no sleep mode, and no CUDA
memory to start in): `LLM` records the engine's calls into it, in order, and refuses to start as vLLM 0.32 does
when the device's free memory is below its share of the device (`gpu_memory_utilization` x total)."""

from __future__ import annotations

import sys
import types

import torch


class FakeLLM:
    """Records the engine's calls into vLLM's LLM, in order, into `calls`."""

    calls: list = []

    def __init__(self, **kwargs) -> None:
        if torch.cuda.is_available():
            # vLLM's worker at start-up: the free memory must cover the share it was given
            free, total = torch.cuda.mem_get_info()
            wanted = kwargs["gpu_memory_utilization"] * total
            if free < wanted:
                raise ValueError(f"Free memory on device ({free / 2**30:.2f}/{total / 2**30:.2f} GiB) on startup is "
                                 f"less than desired GPU memory utilization ({kwargs['gpu_memory_utilization']}, "
                                 f"{wanted / 2**30:.2f} GiB). Decrease GPU memory utilization or reduce GPU memory "
                                 f"used by other processes.")
        self.calls.append(("LLM", kwargs))

    def sleep(self, level: int = 1) -> None:
        self.calls.append(("sleep", level))

    def wake_up(self, tags=None) -> None:
        self.calls.append(("wake_up", tags))

    def apply_model(self, function) -> None:
        class Model:
            def load_weights(model_self, weights):
                self.calls.append(("load_weights", len(list(weights))))
        function(Model())

    def reset_prefix_cache(self) -> None:
        self.calls.append(("reset_prefix_cache",))


def install(monkeypatch) -> list:
    """A `vllm` module whose platform is a GPU with sleep mode; returns the list its calls go to."""
    platform = types.SimpleNamespace(is_cpu=lambda: False, is_sleep_mode_available=lambda: True)
    vllm = types.ModuleType("vllm")
    vllm.LLM = FakeLLM
    platforms = types.ModuleType("vllm.platforms")
    platforms.current_platform = platform
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.platforms", platforms)
    calls: list = []
    monkeypatch.setattr(FakeLLM, "calls", calls)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append(("empty_cache",)))
    return calls

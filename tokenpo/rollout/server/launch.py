"""The vLLM server tokenpo starts when rollout.server.urls is empty: vLLM's own OpenAI-compatible server
(`vllm serve`'s module) on the devices rollout.server.devices names, with the routes the engine uses switched on
(the RL control routes: VLLM_SERVER_DEV_MODE; tokens in and out: --enable-scale-out), the weight-transfer backend,
dummy weights (every weight comes from the first push) and the log-probs of the distribution it samples from."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

from tokenpo.errors import ConfigError
from tokenpo.rollout.config import RolloutConfig, vllm_sizing
from tokenpo.rollout.server.process import ServerSpec

# CPU servers: prompt tokens one scheduler step may take (see server_command)
CPU_BATCHED_TOKENS = 65536
# the routes /pause, /resume, /init_weight_transfer_engine, /update_weights... are vLLM's "dev mode" routes
SERVER_ENV = {"VLLM_SERVER_DEV_MODE": "1"}


def on_gpus(cfg: RolloutConfig) -> bool:
    return cfg.server.devices != ("cpu",)


def transfer_backend(cfg: RolloutConfig, cuda_available: bool) -> str:
    """rollout.server.transfer with auto resolved: NCCL for GPU servers, gloo for CPU ones; servers given by URL
    run where the trainer does (GPU trainer: NCCL)."""
    if cfg.server.transfer != "auto":
        return cfg.server.transfer
    return "nccl" if (on_gpus(cfg) if not cfg.server.urls else cuda_available) else "gloo"


def server_command(cfg: RolloutConfig, folder: str, dtype: str, backend: str) -> list[str]:
    """`vllm serve`'s arguments for the model in `folder`."""
    s, v = cfg.server, cfg.vllm
    replicas = len(s.devices) // s.tensor_parallel_size if on_gpus(cfg) else 1
    sizing = vllm_sizing(v, "cuda" if on_gpus(cfg) else "cpu")
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", folder,
               "--host", s.host, "--port", str(s.port), "--load-format", "dummy", "--dtype", dtype,
               "--seed", str(v.seed), "--generation-config", "vllm", "--logprobs-mode", "processed_logprobs",
               "--enable-scale-out", "--weight-transfer-config", json.dumps({"backend": backend}),
               "--tensor-parallel-size", str(s.tensor_parallel_size), "--data-parallel-size", str(replicas)]
    if sizing.enforce_eager:
        command.append("--enforce-eager")
    if v.max_model_len is not None:
        command += ["--max-model-len", str(v.max_model_len)]
    if on_gpus(cfg):
        command += ["--gpu-memory-utilization", str(s.gpu_memory_utilization)]
    else:
        # vLLM's CPU sampler cannot continue a seeded request whose prefill was split over two scheduler steps
        # ("CPU Generator does not use offset"), which its server's default budget of 2048 tokens a step does once
        # a step's prompts exceed it: a budget no step's prompts reach (extra_args may set another)
        command += ["--max-num-batched-tokens", str(CPU_BATCHED_TOKENS)]
    return command + [str(arg) for arg in s.extra_args]


def server_env(cfg: RolloutConfig) -> dict[str, str]:
    s = cfg.server
    if on_gpus(cfg):
        return {**SERVER_ENV, "CUDA_VISIBLE_DEVICES": ",".join(str(device) for device in s.devices)}
    kv_gib = vllm_sizing(cfg.vllm, "cpu").kv_cache_bytes / 2**30
    cores = {"VLLM_CPU_OMP_THREADS_BIND": str(s.cpu_cores)} if s.cpu_cores != "" else {}
    # vLLM's CPU backend takes its KV cache size in whole GiB
    return {**SERVER_ENV, "VLLM_CPU_KVCACHE_SPACE": str(max(1, round(kv_gib))), **cores}


def server_spec(cfg: RolloutConfig, folder: str, dtype: str, backend: str, log_dir: Path) -> ServerSpec:
    """The server tokenpo starts: vLLM's server in this Python (whose environment must have vLLM)."""
    if importlib.util.find_spec("vllm") is None:
        raise ConfigError("rollout=vllm_server starts a vLLM server with this Python, which has no vLLM: run with the "
                          "environment `bash scripts/setup_vllm.sh` prints, or give running servers in "
                          "rollout.server.urls (docs/rollout.md)")
    s = cfg.server
    where = "cpu" + (f" cores {s.cpu_cores}" if s.cpu_cores else "") if not on_gpus(cfg) else \
        "cuda:" + ",".join(str(device) for device in s.devices)
    return ServerSpec(name=f"vLLM server {s.host}:{s.port} ({where})", command=tuple(server_command(cfg, folder, dtype, backend)),
                      host=s.host, port=s.port, env=server_env(cfg), log_path=log_dir / f"vllm_server_{s.port}.log")

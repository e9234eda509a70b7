"""Typed schema of the `rollout` config group."""

from __future__ import annotations

from dataclasses import dataclass

from tokenpo.schema import build, check_fields, require, section, setting

VLLM_DTYPES = ("auto", "float32", "bfloat16", "float16")
# vLLM's sleep levels that free the KV cache: 1 offloads the weights to host memory, 2 discards them
SLEEP_LEVELS = (1, 2)
# what the device-dependent nulls take on CPU (vLLM's CPU backend: a KV cache of fixed size in RAM, no CUDA graphs),
# and vLLM's share of the memory wherever no plan sized it (TRL's colocate default, vllm_gpu_memory_utilization)
CPU_KV_CACHE_GIB = 1.0
DEFAULT_MEMORY_SHARE = 0.3


@dataclass
class VLLMConfig:
    """The `vllm` engine's settings (read only by it; conf/rollout/vllm.yaml writes each with its help)."""

    dtype: str = setting("auto",
        "weights' dtype in vLLM: auto (the policy's, fp32 here) | float32 | bfloat16 | float16 (GPU runs: bfloat16)",
        choices=VLLM_DTYPES)
    # colocated, one engine per trainer process: ranks sharing one tensor-parallel engine would have to generate the
    # same groups, which the trainer's split of the groups over ranks does not do yet
    tensor_parallel_size: int = setting(1,
        "GPUs one engine spans (tensor parallel); only 1 for now: one colocated engine per trainer process",
        choices=(1,),
        requirement="1 (one colocated engine per trainer process; tensor parallelism is not supported yet)")
    gpu_memory_utilization: float | None = setting(None,
        "fraction of device memory vLLM may take, weights + KV cache + its working memory (null: on CUDA what the "
        "memory plan's other parts leave it, logged at start; on CPU 0.3 of the RAM; TRL colocate default: 0.3)",
        gt=0, le=1, requirement="in (0, 1]")
    kv_cache_gib: float | None = setting(None,
        "KV-cache size in GiB, overrides gpu_memory_utilization's sizing (null: on CUDA the rest of vLLM's share; CPU: "
        "1)", gt=0)
    enforce_eager: bool | None = setting(None,
        "no CUDA graphs / torch.compile (null: false on CUDA, graphs on for faster decoding; true on CPU, fast start)")
    max_model_len: int | None = setting(None,
        "longest prompt + response in tokens (null: the model's max_position_embeddings)", ge=1)
    seed: int = setting(0,
        "vLLM's global RNG seed (each request carries its own seed, drawn from the run's seed, step and round)")
    sleep_mode: bool = setting(True,
        "release vLLM's memory for the worst-case pass and each policy update (vLLM sleep mode; GPUs only, "
        "none on CPU)")
    sleep_level: int = setting(2,
        "2: KV cache and weights discarded (the sync rewrites them; verl, TRL colocate) | 1: weights offloaded to host "
        "RAM", choices=SLEEP_LEVELS, requirement="1 or 2")

    def validate(self) -> None:
        check_fields(self, "rollout.vllm")


# the weight transfers the vllm_server engine drives through vLLM's weight-transfer API (tokenpo.rollout.server.push)
SERVER_TRANSFERS = ("auto", "nccl", "gloo")
# what a request in flight does when new weights reach its server (docs/rollout.md, "Partial rollouts"): vLLM's
# pause modes, passed to its /pause as they are
IN_FLIGHT = ("keep", "wait", "abort")


@dataclass
class ServerConfig:
    """The `vllm_server` engine's servers (tokenpo.rollout.server; conf/rollout/vllm_server.yaml writes each with its
    help). The model's settings (dtype, max_model_len, enforce_eager, seed, the CPU KV cache) are rollout.vllm's."""

    urls: tuple = setting((),
        "vLLM servers already running, http://host:port each (another srun step, a Slurm het-job component): "
        "generation goes to them and tokenpo starts none; empty: tokenpo starts its own on `devices`")
    devices: tuple = setting(("cpu",),
        "Where tokenpo starts its server when no urls are given: [cpu] (a CPU server) or GPU indices of this node "
        "(e.g. [6, 7]), one vLLM server with len(devices) / tensor_parallel_size data-parallel replicas")
    tensor_parallel_size: int = setting(1, "GPUs one replica spans (tensor parallel)", ge=1)
    host: str = setting("127.0.0.1",
        "Address tokenpo's server listens on (0.0.0.0: reachable from other nodes)")
    port: int = setting(8100, "Port tokenpo's server listens on", ge=1, le=65535)
    cpu_cores: str | int = setting("",
        "CPU server: the cores its threads run on (vLLM's VLLM_CPU_OMP_THREADS_BIND, e.g. 1 or 0-3; empty: vLLM's "
        "choice); give the trainer the others (trainer.threads)")
    gpu_memory_utilization: float = setting(0.9,
        "GPU server: fraction of each of its GPUs vLLM takes (its GPUs are its own; vLLM's default 0.9)", gt=0, le=1)
    transfer: str = setting("auto",
        "How weights reach the servers, through vLLM's weight-transfer API: nccl (GPU servers) | gloo (CPU servers: "
        "tokenpo's backend, registered with vLLM as a plugin) | auto (nccl for GPU servers, gloo for CPU ones)",
        choices=SERVER_TRANSFERS)
    transfer_address: str | None = setting(None,
        "Address the servers reach the trainer's rank 0 at for the weight transfer (null: 127.0.0.1 for a server "
        "tokenpo starts, this node's host name for servers given by urls)")
    transfer_port: int = setting(29700, "Port of the weight transfer's rendezvous at the trainer's rank 0",
                                 ge=1, le=65535)
    bucket_mib: float = setting(512,
        "Weights announced per update_weights call, in MiB (the trainer streams them module by module)", gt=0)
    in_flight: str = setting("keep",
        "A request in flight when new weights arrive (generation ahead): keep (paused, continued on the new "
        "weights: a partial rollout, each token's version and log-prob kept) | wait (the push waits for it) | "
        "abort (dropped, sampled again by the new version)", choices=IN_FLIGHT)
    startup_timeout_s: float = setting(900, "Seconds a server may take to start and answer /health", gt=0)
    request_timeout_s: float = setting(1800,
        "Seconds one generation request may take before its server counts as stuck", gt=0)
    push_timeout_s: float = setting(600, "Seconds a weight push may take before it counts as stuck", gt=0)
    extra_args: tuple = setting((),
        "More `vllm serve` arguments for the server tokenpo starts (e.g. [--max-num-seqs, '256'])")

    def validate(self) -> None:
        check_fields(self, "rollout.server")
        require(bool(self.urls) or self.devices == ("cpu",) or all(str(d).isdigit() for d in self.devices),
                f"rollout.server.devices={list(self.devices)}: [cpu] or GPU indices of this node (e.g. [6, 7])")
        require(self.devices == ("cpu",) or len(self.devices) % self.tensor_parallel_size == 0,
                f"rollout.server.devices has {len(self.devices)} GPUs, not a multiple of "
                f"rollout.server.tensor_parallel_size={self.tensor_parallel_size}")


@dataclass(frozen=True)
class VLLMSizing:
    """vLLM's memory settings on one device, every null of VLLMConfig resolved."""

    gpu_memory_utilization: float
    kv_cache_bytes: int | None  # None: vLLM sizes its KV cache from gpu_memory_utilization
    enforce_eager: bool


def vllm_sizing(v: VLLMConfig, device: str) -> VLLMSizing:
    """The nulls for `device` (cuda | cpu). On CUDA: CUDA graphs on (vLLM's own default, and verl's and TRL's), and
    the KV cache whatever vLLM's share of the device leaves after its weights and its own activations and graphs
    (vLLM profiles them at start-up); the share is the memory plan's (tokenpo.plan.memory.with_vllm_share fills it
    in before the engine is built), else DEFAULT_MEMORY_SHARE. On CPU: eager, a KV cache of CPU_KV_CACHE_GIB."""
    cuda = device == "cuda"
    kv_cache_gib = v.kv_cache_gib if v.kv_cache_gib is not None or cuda else CPU_KV_CACHE_GIB
    return VLLMSizing(
        gpu_memory_utilization=v.gpu_memory_utilization or DEFAULT_MEMORY_SHARE,
        kv_cache_bytes=None if kv_cache_gib is None else int(kv_cache_gib * 2**30),
        enforce_eager=not cuda if v.enforce_eager is None else v.enforce_eager,
    )


@dataclass
class AsyncConfig:
    """Generation ahead of the update (tokenpo.rollout.ahead, tokenpo.trainer.core.source.Schedule)."""

    max_staleness: int = setting(0,
        "Policy versions generation runs ahead of the update (k; 0 = generate, then train, in turn): step r's batch is "
        "sampled by the policy after max(0, r - 1 - k) updates, in a generator process with its own weights (hf, "
        "vllm: the engine runs there; vllm_server: on its servers; verl's one-step-off-policy is k = 1)", ge=0)
    decoupled: bool = setting(True,
        "Ratios are taken and clipped against the trainer's policy at the start of the update, the proximal policy "
        "(AReaL's decoupled PPO), and the sampler's log-probs only weigh the loss (algorithm.loss.tis_cap); false: "
        "the sampler's log-probs are the old policy's (plain PPO on stale data, AReaL's control)")
    generator_threads: int = setting(0,
        "Intra-op CPU threads of the generator process (0 = torch's default; on CPU give generation and training "
        "each the cores they would use in turn)", ge=0)
    generator_device: str = setting("cpu",
        "Device of the generator process's model (hf engine; vLLM's engine runs on the device vLLM picks): cpu | "
        "cuda:<index> (one training process: a device it does not use, or its own to share it; several: cpu only; "
        "not run on a GPU yet)", check=lambda value: value == "cpu" or str(value).startswith("cuda:"),
        requirement="cpu or cuda:<index>")

    def validate(self, engine: str) -> None:
        from tokenpo.rollout.engine import ENGINES

        check_fields(self, "rollout.async")
        require(self.max_staleness == 0 or ENGINES.trait(engine, "ahead") is not None,
                f"rollout.async.max_staleness={self.max_staleness}: rollout.engine={engine} cannot generate ahead "
                f"(docs/rollout.md): use rollout=hf, rollout=vllm or rollout=vllm_server, or max_staleness=0")


@dataclass
class RolloutConfig:
    engine: str = setting("hf",
        "Rollout engine (registry name): hf (the policy's own modules) | vllm (colocated, conf/rollout/vllm.yaml) | "
        "vllm_server (vLLM servers of their own, conf/rollout/vllm_server.yaml)")
    group_size: int = setting(4, "Responses per prompt G (GRPO paper: 64; DAPO: 16; CPU demo: 4)", ge=1)
    max_new_tokens: int = setting(32, "Maximum response length in tokens (DAPO paper: 20480; CPU demo: 32)", ge=1)
    temperature: float = setting(1.0, "Sampling temperature (papers: 1.0)", ge=0)
    top_p: float = setting(1.0, "Nucleus sampling mass (papers: 1.0 for training)", gt=0, le=1)
    share_prefill: bool = setting(True, "Run each prompt's prefill once and share its KV cache across its G samples")
    eos_tokens: tuple = setting((), "Extra token ids that end a response (the tokenizer's EOS always does)")
    hf_stop_check_every: int | None = setting(None,
        "hf engine: decode steps between host checks that drop stopped rows from the batch (null: 1 on CPU, where a "
        "check is free; 16 on GPUs, where each one stalls kernel launches); the tokens do not depend on it", ge=1)
    vllm: VLLMConfig = section(VLLMConfig,
        "vLLM's own settings (read only by the vllm engine; share_prefill does not apply: vLLM's prefix cache shares "
        "prompts)")
    server: ServerConfig = section(ServerConfig,
        "The vllm_server engine's vLLM servers: started by tokenpo or given by URL (docs/rollout.md)")
    async_: AsyncConfig = section(AsyncConfig,
        "Generation ahead of the update by a bounded number of policy versions, with corrected off-policy updates "
        "(docs/rollout.md)")

    def validate(self) -> None:
        from tokenpo.rollout.engine import ENGINES

        # the name only: an engine's package is needed where it runs (build_generator), not to validate a config
        ENGINES.check(self.engine)
        check_fields(self, "rollout")
        self.vllm.validate()
        self.server.validate()
        self.async_.validate(self.engine)


def rollout_config_from_dict(d: dict) -> RolloutConfig:
    return build(RolloutConfig, d, "rollout")


def require_sampler_logprobs(tis_cap: float | None, rollout: RolloutConfig) -> None:
    """Truncated importance sampling (algorithm.loss.tis_cap) weighs tokens by the engine's own log-probs."""
    from tokenpo.rollout.engine import ENGINES

    require(tis_cap is None or bool(ENGINES.trait(rollout.engine, "logprobs")) or rollout.async_.max_staleness > 0,
            f"algorithm.loss.tis_cap={tis_cap} needs the rollout engine's log-probs, which rollout.engine="
            f"{rollout.engine} does not return in turn: use rollout=vllm, rollout.async.max_staleness >= 1 (the "
            f"generator process returns them), or tis_cap=null")

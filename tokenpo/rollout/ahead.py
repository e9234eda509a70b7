"""A generator process for rollouts sampled ahead of the update (rollout.async.max_staleness = k >= 1).

The engine rollout.engine names (one with the registry's trait ahead="process": hf, vllm) runs in a process of its
own (torch.multiprocessing, spawn) with its own copy of the weights, so it samples the next steps' rollouts while the
trainer updates. Requests go to it in order, each naming the policy version that must sample it (version v: the
policy after v updates); the worker generates with exactly that version, so a run's rollouts do not depend on timing.
Weights go through one shared-memory copy of the model: the trainer writes version v there (`load`) only once no
submitted request still needs the version it holds and the worker has not copied out (`loaded`). The worker hands
its engine each version it takes as a `Published` over the shared tensors (`SharedVersions`): the vllm engine copies
them into its own engine at `load`; the hf engine generates with an HF model built from the published config (the
base model: a LoRA policy publishes merged weights), which takes every weight from the shared copy once per version.
What each request waited for, the worker for weights and the trainer for rollouts, is reported with it.

`AheadGenerator` is a `Generator`: the requests go to the process. An engine that generates with the policy's live
module (trait policy_module: hf) also runs in the trainer's process (`local`) and samples the evaluations with the
live policy; another (vllm) samples them in the generator process with the newest version pushed, so that no
second copy of its weights and KV cache is built beside the trainer.
"""

from __future__ import annotations

import contextlib
import functools
import os
import queue
import time
from collections import defaultdict
from dataclasses import dataclass, replace

import torch
import torch.multiprocessing as mp

from tokenpo.errors import ConfigError
from tokenpo.lifeline import die_with_parent
from tokenpo.rollout.engine import ENGINES, Responses, SamplingParams, get_engine
from tokenpo.models.published import Published
from tokenpo.rollout.generator import GenerateRequest, Generated, Generator, GeneratorDown, restored_results, results_state

# seconds between looks at the shared version counters (the worker for weights, the trainer for the worker's load)
POLL_S = 0.002
# seconds the trainer waits for one result before it checks that the worker is alive
RESULT_POLL_S = 1.0
# the step of an evaluation's request key (training requests are keyed by steps from 1)
EVALUATION_STEP = -1
# the seeds an evaluation sent to the worker draws from (the worker seeds its sampling generator with one)
SEED_RANGE = 2**31 - 1
# what a launcher (torchrun, trainer.nproc) sets for a rank: the worker is no rank, and the engine it starts (vLLM)
# is a plain single-process one
LAUNCHER_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                      "GROUP_RANK", "ROLE_RANK", "ROLE_WORLD_SIZE", "TORCHELASTIC_RUN_ID")


@dataclass(frozen=True)
class WorkerSettings:
    """What the worker builds its engine from (picklable): the engine is rollout.engine, built through the registry
    as in the trainer's process."""

    rollout: object  # the run's RolloutConfig
    tokenizer: object
    threads: int  # its intra-op threads (0: torch's default)
    device: str = "cpu"  # the engine's device (the hf engine's model; the vllm engine's sampling seeds)

    @classmethod
    def from_config(cls, cfg, tokenizer, world_size: int) -> WorkerSettings:
        """From the rollout config (RolloutConfig) of a run of `world_size` processes."""
        return cls(cfg, tokenizer, cfg.async_.generator_threads,
                   generator_device(cfg.async_.generator_device, world_size))


@dataclass(frozen=True)
class ModelSpec:
    """What the published versions are a model of: its Hugging Face config, its weights' dtype, its class name."""

    config: object
    dtype: torch.dtype
    architecture: str

    @classmethod
    def of(cls, published: Published) -> ModelSpec:
        return cls(published.config, published.dtype, published.architecture)


def generator_device(device: str, world_size: int) -> str:
    """rollout.async.generator_device for this process: one device names one generator, so a CUDA device is refused
    when several processes would each put their generator on it (a device per process is not built yet)."""
    if device != "cpu" and world_size > 1:
        raise ConfigError(f"rollout.async.generator_device={device}: each of the {world_size} processes starts its "
                          f"own generator, and they would share that one device; use cpu with several processes "
                          f"(a device per process is not supported yet)")
    return device


def worker_model(spec: ModelSpec, device: str) -> torch.nn.Module:
    """An HF model of the published architecture, in the published dtype, its weights to be copied in."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(spec.config, dtype=spec.dtype,
                                             attn_implementation=spec.config._attn_implementation)
    return model.to(device).eval()


def load_shared(model: torch.nn.Module, shared: dict[str, torch.Tensor]) -> None:
    """The shared weights into `model`, by name (a tied output layer gets the embedding's values twice)."""
    state = model.state_dict(keep_vars=True)
    with torch.no_grad():
        for name, tensor in shared.items():
            state[name].copy_(tensor)


class SharedVersions:
    """The worker's side of the shared copy: each version it takes as a `Published` over the shared tensors.
    `tensors` yields them as they are (an engine copies them into its own weights at `load`); `module` lends an HF
    model holding them, built on the first call (only an engine that generates with the live module makes one) and
    loaded once per version. `loaded` (shared with the trainer) names the version copied out last."""

    def __init__(self, shared: dict[str, torch.Tensor], spec: ModelSpec, device: str, loaded) -> None:
        self.shared, self.spec, self.device, self.loaded = shared, spec, device, loaded
        self.model: torch.nn.Module | None = None
        self.model_version = -1  # the version the model holds

    def published(self, version: int) -> Published:
        """Version `version`, which the shared copy holds now."""
        return Published(version, lambda: iter(self.shared.items()), functools.partial(self._module, version),
                         self.spec.config, self.spec.dtype, self.spec.architecture)

    def _module(self, version: int) -> contextlib.AbstractContextManager[torch.nn.Module]:
        if self.model is None:
            self.model = worker_model(self.spec, self.device)
        if self.model_version != version:
            load_shared(self.model, self.shared)
            self.model_version = self.loaded.value = version
        return contextlib.nullcontext(self.model)


class Worker:
    """The generator process's engine, and the version it holds."""

    def __init__(self, settings: WorkerSettings, versions: SharedVersions, pushed) -> None:
        rollout = settings.rollout
        self.versions, self.pushed, self.held = versions, pushed, -1
        # the engine holds no version until a request names one (the shared copy's first is pushed by `load`)
        self.engine = get_engine(rollout.engine)(rollout, settings.tokenizer, versions.published(self.held),
                                                 torch.device(settings.device))
        # such an engine reads the shared copy while it samples: the version counts as copied out once its model
        # holds it (SharedVersions.module), not at `load`
        self.reads_module = bool(ENGINES.trait(rollout.engine, "policy_module"))

    def answer(self, request: GenerateRequest) -> Generated:
        """`request` sampled by the version it names, once pushed (the seconds waited for it are reported)."""
        waited = time.perf_counter()
        while self.held < request.version:
            if self.pushed.value > self.held:  # the shared copy holds a version newer than the engine's
                self.take(self.pushed.value)
            else:
                time.sleep(POLL_S)
        if self.held != request.version:
            raise RuntimeError(f"rollout generator: request {request.key} needs policy version {request.version}, "
                               f"the worker holds {self.held} (the trainer pushed past it)")
        waited = time.perf_counter() - waited
        self.engine.submit(request)
        generated, _ = self.engine.result(request.key)
        return replace(generated, weights_wait_s=waited)

    def take(self, version: int) -> None:
        self.engine.load(self.versions.published(version))
        self.held = version
        if not self.reads_module:
            self.versions.loaded.value = version


def as_a_plain_process() -> None:
    """The worker of a rank of a multi-process run inherits the launcher's variables: dropped, so that nothing in it
    (vLLM) takes it for a rank (torch.distributed is not initialised here: the engines see a world of one)."""
    for name in LAUNCHER_VARIABLES:
        os.environ.pop(name, None)


def worker_main(trainer: int, settings: WorkerSettings, spec: ModelSpec, requests, results,
                shared: dict[str, torch.Tensor], pushed, loaded) -> None:
    """The generator process: requests in, `Generated` out, until a None request. `trainer`: the trainer's pid, which
    it dies with however the trainer dies (daemon=True stops it only at a clean exit); an engine it starts in its
    own process (vLLM keeps its engine core in this one) dies with it."""
    die_with_parent(trainer)
    as_a_plain_process()
    if settings.threads:
        torch.set_num_threads(settings.threads)
    worker = Worker(settings, SharedVersions(shared, spec, settings.device, loaded), pushed)
    while (request := requests.get()) is not None:
        results.put(worker.answer(request))
    worker.engine.close()


class AheadGenerator:
    """The trainer's side: the worker process, its queues and the shared weights; `local`, the engine in this
    process that samples evaluations with the live policy, or None: the worker samples them."""

    def __init__(self, settings: WorkerSettings, local: Generator | None, published: Published) -> None:
        context = mp.get_context("spawn")
        self.local = local
        # one shared copy of every weight, filled by each load
        self.shared = {name: tensor.detach().to("cpu", copy=True).share_memory_()
                       for name, tensor in published.tensors()}
        self.pushed, self.loaded = context.Value("q", -1), context.Value("q", -1)
        self.requests, self.results = context.Queue(), context.Queue()
        self.pending: dict[tuple[int, int], GenerateRequest] = {}  # submitted, result not yet taken
        self.done: dict[tuple[int, int], Generated] = {}  # results taken from the queue, or restored
        self.waits: dict[str, list[float]] = defaultdict(list)
        self.evaluations = 0  # evaluations sent to the worker (their request keys)
        self.process = context.Process(target=worker_main, daemon=True, name="tokenpo-generator",
                                       args=(os.getpid(), settings, ModelSpec.of(published), self.requests,
                                             self.results, self.shared, self.pushed, self.loaded))
        self.process.start()

    def load(self, published: Published) -> None:
        """Version `published.version` into the shared copy, once the worker has copied out the version it held if
        a request it has not answered needs that one (the seconds waited are timing/trainer_wait_weights_s); the
        local engine takes it too. The tensors are read in every case (under ZeRO-3 a collective)."""
        if self.local is not None:
            self.local.load(published)
        held = self.pushed.value
        start = time.perf_counter()
        while self.loaded.value < held and any(r.version == held for r in self.pending.values()):
            self._check_alive()
            time.sleep(POLL_S)
        self.waits["timing/trainer_wait_weights_s"].append(time.perf_counter() - start)
        with torch.no_grad():
            for name, tensor in published.tensors():
                self.shared[name].copy_(tensor)
        self.pushed.value = published.version

    def submit(self, request: GenerateRequest) -> None:
        if request.key in self.done:  # restored from a checkpoint with its result
            return
        if request.version > self.pushed.value:
            raise RuntimeError(f"rollout generator: request {request.key} needs policy version {request.version}, "
                               f"only {self.pushed.value} was pushed")
        self.pending[request.key] = request
        self.requests.put(request)

    def result(self, key: tuple[int, int]) -> tuple[Generated, float]:
        """(the result of the request `key`, the seconds the trainer waited for it)."""
        start = time.perf_counter()
        while key not in self.done:
            try:
                got = self.results.get(timeout=RESULT_POLL_S)
            except queue.Empty:
                self._check_alive()
                continue
            self.done[got.key] = got
        self.pending.pop(key, None)
        return self.done.pop(key), time.perf_counter() - start

    def sample(self, prompt_ids, params: SamplingParams, rng: torch.Generator) -> Responses:
        """The local engine's responses, or the worker's from the newest version pushed (after the requests
        submitted before), drawn from one seed taken from `rng`."""
        if self.local is not None:
            return self.local.sample(prompt_ids, params, rng)
        seed = int(torch.randint(SEED_RANGE, (1,), generator=rng, device=rng.device))
        self.evaluations += 1
        key = (EVALUATION_STEP, self.evaluations)
        self.submit(GenerateRequest(key, prompt_ids, params, seed, self.pushed.value))
        return self.result(key)[0].responses

    def sleep(self) -> None:
        """The local engine's memory released; the worker keeps its own: it generates while the trainer updates."""
        if self.local is not None:
            self.local.sleep()

    def wake_up(self) -> None:
        if self.local is not None:
            self.local.wake_up()

    def state_dict(self) -> dict:
        """Every submitted request's result, waited for (plain data): a resumed run takes them back."""
        for key in sorted(self.pending):
            self.done[key] = self.result(key)[0]
        return results_state(self.done)

    def load_state_dict(self, state: dict) -> None:
        self.done.update(restored_results(state))

    def take_metrics(self) -> dict[str, float]:
        taken, self.waits = self.waits, defaultdict(list)
        return {key: float(sum(values)) for key, values in taken.items()}

    def _check_alive(self) -> None:
        if not self.process.is_alive():
            raise GeneratorDown(f"rollout generator process died (exit code {self.process.exitcode}); its error is "
                               f"above in the log")

    def close(self) -> None:
        if self.process.is_alive():
            self.requests.put(None)
            self.process.join(timeout=30)
        if self.process.is_alive():
            self.process.kill()
        if self.local is not None:
            self.local.close()

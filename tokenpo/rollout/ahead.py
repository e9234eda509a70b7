"""A generator process for rollouts sampled ahead of the update (rollout.async.max_staleness = k >= 1).

The `hf` engine runs in a process of its own (torch.multiprocessing, spawn) with its own copy of the weights, so it
samples the next steps' rollouts while the trainer updates. Requests go to it in order, each naming the policy
version that must sample it (version v: the policy after v updates); the worker generates with exactly that version,
so a run's rollouts do not depend on timing. Weights go through one shared-memory copy of the model: the trainer
writes version v there (`load`) only once no submitted request still needs the version it holds and the worker has
not loaded (the worker copies it into its own model when a request names it). What each request waited for, the
worker for weights and the trainer for rollouts, is reported with it. The worker builds its model from the published
version's config (the base model: a LoRA policy publishes merged weights) and takes every weight from the pushes.

`AheadGenerator` is a `Generator`: the requests go to the process, and the engine in the trainer's process (`local`)
samples the evaluations with the live policy.
"""

from __future__ import annotations

import os
import queue
import time
from collections import defaultdict
from dataclasses import dataclass

import torch
import torch.multiprocessing as mp

from tokenpo.errors import ConfigError
from tokenpo.lifeline import die_with_parent
from tokenpo.rollout.engine import Responses, SamplingParams, seeded_generator
from tokenpo.models.published import Published
from tokenpo.rollout.generator import GenerateRequest, Generated, Generator, GeneratorDown, restored_results, results_state

# seconds between looks at the shared version counters (the worker for weights, the trainer for the worker's load)
POLL_S = 0.002
# seconds the trainer waits for one result before it checks that the worker is alive
RESULT_POLL_S = 1.0


@dataclass(frozen=True)
class WorkerSettings:
    """What the worker builds its engine from (picklable); its model comes from the published config."""

    pad_id: int
    threads: int  # its intra-op threads (0: torch's default)
    stop_check_every: int | None  # rollout.hf_stop_check_every
    device: str = "cpu"  # its model's device

    @classmethod
    def from_config(cls, cfg, pad_id: int, world_size: int) -> WorkerSettings:
        """From the rollout config (RolloutConfig) of a run of `world_size` processes."""
        return cls(pad_id, cfg.async_.generator_threads, cfg.hf_stop_check_every,
                   generator_device(cfg.async_.generator_device, world_size))


def generator_device(device: str, world_size: int) -> str:
    """rollout.async.generator_device for this process: one device names one generator, so a CUDA device is refused
    when several processes would each put their generator on it (a device per process is not built yet)."""
    if device != "cpu" and world_size > 1:
        raise ConfigError(f"rollout.async.generator_device={device}: each of the {world_size} processes starts its "
                          f"own generator, and they would share that one device; use cpu with several processes "
                          f"(a device per process is not supported yet)")
    return device


def worker_model(config, dtype: torch.dtype, device: str) -> torch.nn.Module:
    """The worker's model: the published config's architecture, in the published dtype, its weights to be pushed."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation=config._attn_implementation)
    return model.to(device).eval()


def load_shared(model: torch.nn.Module, shared: dict[str, torch.Tensor]) -> None:
    """The shared weights into `model`, by name (a tied output layer gets the embedding's values twice)."""
    state = model.state_dict(keep_vars=True)
    with torch.no_grad():
        for name, tensor in shared.items():
            state[name].copy_(tensor)


def worker_main(trainer: int, settings: WorkerSettings, model_from: tuple, requests, results,
                shared: dict[str, torch.Tensor], pushed, loaded) -> None:
    """The generator process: requests in, `Generated` out, until a None request. `trainer`: the trainer's pid, which
    it dies with however the trainer dies (daemon=True stops it only at a clean exit); `model_from`: (config, dtype)."""
    die_with_parent(trainer)
    if settings.threads:
        torch.set_num_threads(settings.threads)
    model = worker_model(*model_from, settings.device)
    while (request := requests.get()) is not None:
        waited = time.perf_counter()
        while loaded.value < request.version:
            if pushed.value > loaded.value:  # the buffer holds a version newer than the model's
                load_shared(model, shared)
                loaded.value = pushed.value
            else:
                time.sleep(POLL_S)
        if loaded.value != request.version:
            raise RuntimeError(f"rollout generator: request {request.key} needs policy version {request.version}, "
                               f"the worker holds {loaded.value} (the trainer pushed past it)")
        waited = time.perf_counter() - waited
        started = time.perf_counter()
        out = generate_request(model, request, settings)
        results.put(Generated(request.key, out, request.version, waited, time.perf_counter() - started))


def generate_request(model: torch.nn.Module, request: GenerateRequest, settings: WorkerSettings) -> Responses:
    """`request`'s responses from the worker's `model`, drawn from the request's seed on the model's device."""
    from tokenpo.rollout.hf import generate_hf

    return generate_hf(model, request.prompt_ids, request.params, settings.pad_id,
                       seeded_generator(request.seed, settings.device), settings.stop_check_every)


class AheadGenerator:
    """The trainer's side: the worker process, its queues and the shared weights; `local`, the engine in this
    process, samples evaluations."""

    def __init__(self, settings: WorkerSettings, local: Generator, published: Published) -> None:
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
        self.process = context.Process(target=worker_main, daemon=True, name="tokenpo-generator",
                                       args=(os.getpid(), settings, (published.config, published.dtype), self.requests,
                                             self.results, self.shared, self.pushed, self.loaded))
        self.process.start()

    def load(self, published: Published) -> None:
        """Version `published.version` into the shared copy, once the worker has loaded the version it held if a
        request it has not started needs that one (the seconds waited are timing/trainer_wait_weights_s); the
        local engine takes it too. The tensors are read in every case (under ZeRO-3 a collective)."""
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
        return self.local.sample(prompt_ids, params, rng)

    def sleep(self) -> None:
        self.local.sleep()

    def wake_up(self) -> None:
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
        self.local.close()

"""A generator process for rollouts sampled ahead of the update (rollout.async.max_staleness = k >= 1).

The `hf` engine runs in a process of its own (torch.multiprocessing, spawn) with its own copy of the weights, so it
samples the next steps' rollouts while the trainer updates. Requests go to it in order, each naming the policy
version that must sample it (version v: the policy after v updates); the worker generates with exactly that version,
so a run's rollouts do not depend on timing. Weights go through one shared-memory copy of the model: the trainer
writes version v there (`push`) only once no submitted request still needs the version it holds and the worker has
not loaded (the worker copies it into its own model when a request names it). What each request waited for, the
worker for weights and the trainer for rollouts, is reported with it.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Iterable
from dataclasses import dataclass

import torch
import torch.multiprocessing as mp

from tokenpo.rollout.engine import Responses, SamplingParams, seeded_generator

# seconds between looks at the shared version counters (the worker for weights, the trainer for the worker's load)
POLL_S = 0.002
# seconds the trainer waits for one result before it checks that the worker is alive
RESULT_POLL_S = 1.0


@dataclass(frozen=True)
class GenerateRequest:
    key: tuple[int, int]  # (step, dynamic-sampling round) it is drawn for
    prompt_ids: list[list[int]]
    params: SamplingParams
    seed: int  # the sampling generator's seed
    version: int  # the policy version that samples it


@dataclass(frozen=True)
class Generated:
    key: tuple[int, int]
    responses: Responses
    version: int
    weights_wait_s: float  # the worker waited this long for the version's weights
    generate_s: float


@dataclass(frozen=True)
class WorkerSettings:
    """What the worker builds its model and engine from (picklable)."""

    model: object  # ModelConfig
    seed: int
    pad_id: int
    threads: int  # its intra-op threads (0: torch's default)
    stop_check_every: int | None  # rollout.hf_stop_check_every
    device: str = "cpu"  # its model's device


def load_shared(model: torch.nn.Module, shared: dict[str, torch.Tensor]) -> None:
    """The shared weights into `model`, by name (a tied output layer gets the embedding's values twice)."""
    state = model.state_dict(keep_vars=True)
    with torch.no_grad():
        for name, tensor in shared.items():
            state[name].copy_(tensor)


def worker_main(settings: WorkerSettings, requests, results, shared: dict[str, torch.Tensor], pushed, loaded) -> None:
    """The generator process: requests in, `Generated` out, until a None request."""
    from tokenpo.models.loading import load_model

    if settings.threads:
        torch.set_num_threads(settings.threads)
    _, model = load_model(settings.model, settings.seed)
    model.to(settings.device).eval()
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
    """The trainer's side: the worker process, its queues and the shared weights."""

    def __init__(self, settings: WorkerSettings, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        context = mp.get_context("spawn")
        # one shared copy of every weight, filled by push()
        self.shared = {name: tensor.detach().to("cpu", copy=True).share_memory_() for name, tensor in weights}
        self.pushed, self.loaded = context.Value("q", -1), context.Value("q", -1)
        self.requests, self.results = context.Queue(), context.Queue()
        self.pending: dict[tuple[int, int], GenerateRequest] = {}  # submitted, result not yet taken
        self.done: dict[tuple[int, int], Generated] = {}  # results taken from the queue, not yet handed out
        self.process = context.Process(target=worker_main, daemon=True, name="tokenpo-generator",
                                       args=(settings, self.requests, self.results, self.shared, self.pushed,
                                             self.loaded))
        self.process.start()

    def push(self, version: int, weights: Iterable[tuple[str, torch.Tensor]]) -> float:
        """Version `version`'s weights into the shared copy; the seconds spent waiting for the worker to load the
        version it held (needed by a request it has not started). `weights` is consumed in every case (under
        ZeRO-3 it gathers with collectives)."""
        held = self.pushed.value
        start = time.perf_counter()
        while self.loaded.value < held and any(r.version == held for r in self.pending.values()):
            self._check_alive()
            time.sleep(POLL_S)
        waited = time.perf_counter() - start
        with torch.no_grad():
            for name, tensor in weights:
                self.shared[name].copy_(tensor)
        self.pushed.value = version
        return waited

    def submit(self, request: GenerateRequest) -> None:
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
        self.pending.pop(key)
        return self.done.pop(key), time.perf_counter() - start

    def drain(self) -> dict[tuple[int, int], Generated]:
        """Every submitted request's result (waiting for those in flight), taken out of the generator."""
        return {key: self.result(key)[0] for key in sorted(self.pending)}

    def _check_alive(self) -> None:
        if not self.process.is_alive():
            raise RuntimeError(f"rollout generator process died (exit code {self.process.exitcode}); its error is "
                               f"above in the log")

    def close(self) -> None:
        if self.process.is_alive():
            self.requests.put(None)
            self.process.join(timeout=30)
        if self.process.is_alive():
            self.process.kill()

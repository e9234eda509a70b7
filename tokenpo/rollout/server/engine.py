"""The `vllm_server` engine: rollouts on vLLM servers of their own (other GPUs or nodes, or CPU cores), started by
tokenpo (rollout.server.devices) or already running (rollout.server.urls), in turn (rollout.async.max_staleness=0)
or ahead of the update (k >= 1: requests run on the servers while the trainer updates).

Each prompt is one request, with its own seed, to the servers in turn (a server with data-parallel replicas spreads
them itself); its samples come back with every token's log-prob and the policy version that sampled it. After each
update the policy's weights are pushed (tokenpo.rollout.server.push); a request in flight then keeps going on the new
weights, waits, or is sampled again (rollout.server.in_flight). A server that dies or stops answering, or a push that
does not finish, is a `GeneratorDown` naming the server: the run saves and stops (tokenpo.trainer.harness.loop).
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import tempfile
import threading
import time
from collections import defaultdict
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

import torch

from tokenpo.deepspeed import dist
from tokenpo.models.published import Published
from tokenpo.rollout.config import RolloutConfig
from tokenpo.rollout.engine import ENGINES, Responses, SamplingParams
from tokenpo.models.config import ModelConfig
from tokenpo.models.loading import model_description
from tokenpo.rollout.generator import (Generated, GenerateRequest, GeneratorDown, agreed, restored_results,
                                      results_state)
from tokenpo.rollout.model_folder import model_folder
from tokenpo.rollout.server import process
from tokenpo.rollout.server.client import ServerCallError
from tokenpo.rollout.server.launch import server_spec, transfer_backend
from tokenpo.rollout.server.push import TransferSetup, WeightPush
from tokenpo.rollout.server.request import Sample, generate

log = logging.getLogger("tokenpo")
# each request draws its seed from the round's generator, as the colocated engine does
SEED_RANGE = 2**31 - 1
# requests open at once per trainer process (one per prompt): enough to keep every server's batch full
MAX_OPEN_REQUESTS = 256
# seconds between health checks while the trainer waits for samples
HEALTH_POLL_S = 5.0


@dataclass
class Launched:
    """The server tokenpo started for a run (on rank 0), not yet ready, with the folder it builds its model from."""

    folder: tempfile.TemporaryDirectory
    server: process.Server | None
    failure: str | None  # why it did not start (one line; its log kept), or None

    def close(self) -> None:
        if self.server is not None:
            process.stop(self.server)
        self.folder.cleanup()


def launch(cfg: RolloutConfig, config, architecture: str | None, tokenizer, dtype: str) -> Launched:
    """The server rollout.server describes started (not waited for) for the model `config` and `tokenizer` describe,
    in `dtype` where rollout.vllm.dtype is auto."""
    folder = model_folder(config, architecture, tokenizer)
    dtype = cfg.vllm.dtype if cfg.vllm.dtype != "auto" else dtype
    log_dir = Path(tempfile.mkdtemp(prefix=f"tokenpo-server-{os.getpid()}-"))
    try:
        spec = server_spec(cfg, folder.name, dtype, transfer_backend(cfg, torch.cuda.is_available()), log_dir)
        log.info("%s starting (its log: %s)", spec.name, spec.log_path)
        return Launched(folder, process.start(spec), None)
    except process.ServerError as error:
        return Launched(folder, None, str(error).splitlines()[0])
    except BaseException:
        folder.cleanup()
        shutil.rmtree(log_dir, ignore_errors=True)
        raise


def failed_start(launched: Launched | None) -> None:
    """A server that did not start is a GeneratorDown with its line (only rank 0 starts one: callers agree)."""
    if launched is not None and launched.failure is not None:
        raise GeneratorDown(launched.failure)


@ENGINES.register("vllm_server")
class VLLMServerEngine:
    def __init__(self, cfg: RolloutConfig, tokenizer, published: Published, device: torch.device,
                 early: Launched | None = None) -> None:
        """`early`: the server `start_early` started on rank 0 before the policy's model loaded."""
        self.cfg, self.server_cfg = cfg, cfg.server
        self.launched = early
        if early is None and not cfg.server.urls and dist.is_main():
            self.launched = launch(cfg, published.config, published.architecture, tokenizer,
                                   str(published.dtype).removeprefix("torch."))
        self.servers: list[process.Server] = []
        self.push: WeightPush | None = None
        self.pool = ThreadPoolExecutor(max_workers=MAX_OPEN_REQUESTS, thread_name_prefix="tokenpo-request")
        self.resumed = threading.Event()  # clear while a push runs: a request aborted by it waits to be sent again
        self.resumed.set()
        self.version = -1
        self.pending: dict[tuple[int, int], tuple[GenerateRequest, list[Future], float]] = {}
        self.done: dict[tuple[int, int], Generated] = {}
        self.measured: dict[str, list[float]] = defaultdict(list)
        self.failed = False  # a server failed: its log is kept past close (every error about it names the file)
        try:
            self._start(published)
        except process.ServerError as error:  # a URL that names no server: one line
            self.failed = True
            self.close()
            raise GeneratorDown(str(error).splitlines()[0]) from None
        except BaseException:
            self.failed = True
            self.close()  # a server started before the failure stops with it
            raise

    @classmethod
    def start_early(cls, cfg: RolloutConfig, model: ModelConfig) -> Launched | None:
        """The server tokenpo starts, started on rank 0 from the model's config and tokenizer before the policy's
        model loads (vLLM boots while the trainer loads: minutes at 7B and more); None for servers given by URL."""
        if cfg.server.urls:
            return None
        launched = None
        if dist.is_main():
            config, tokenizer = model_description(model)
            launched = launch(cfg, config, None, tokenizer, model.dtype)
        try:  # a start that failed at once (a port taken) stops the run before the model loads
            agreed(failed_start, launched)
        except GeneratorDown:
            if launched is not None:
                launched.close()
            raise
        return launched

    def _start(self, published: Published) -> None:
        """The servers ready and the transfer open (the same outcome on every rank: `agreed`); `published` is pushed
        before the first request unless a `load` comes first (a resumed run's first load is its checkpoint's
        weights: one push, not two)."""
        self.servers = self._servers()
        self.urls = [server.url for server in self.servers]
        setup = self._transfer_setup(transfer_backend(self.cfg, torch.cuda.is_available()))
        self.push = agreed(self._guarded, "opening the weight transfer",
                           lambda: WeightPush(self.urls, setup, sender=dist.is_main()))
        self.initial = published

    # --- servers and transfer ---

    def _servers(self) -> list[process.Server]:
        """The servers given by URL, or the one rank 0 started (every rank learns its URL); ready."""
        if self.server_cfg.urls:
            servers = [process.given(url, f"vLLM server {url}") for url in self.server_cfg.urls]
        else:
            agreed(failed_start, self.launched)
            server = self.launched.server if self.launched is not None else None
            url = dist.broadcast_object(server.url if server else None)
            servers = [server or process.given(url, f"vLLM server {url}")]
        started = time.perf_counter()
        agreed(self._ready, servers)
        log.info("vLLM servers ready in %.0f s: %s", time.perf_counter() - started, ", ".join(s.url for s in servers))
        return servers

    def _ready(self, servers: list[process.Server]) -> None:
        try:
            for server in servers:
                process.wait_ready(server, self.server_cfg.startup_timeout_s)
        except process.ServerError as error:
            raise self._down(str(error).splitlines()[0]) from None

    def _transfer_setup(self, backend: str) -> TransferSetup:
        s = self.server_cfg
        address = s.transfer_address or ("127.0.0.1" if not s.urls else socket.getfqdn())
        return TransferSetup(backend, address, s.transfer_port, int(s.bucket_mib * 2**20), s.push_timeout_s)

    def _guarded(self, doing: str, action):
        """`action()`; a server that fails it is a GeneratorDown naming the server and what it was doing (only
        rank 0 talks to the servers: callers agree on the outcome)."""
        try:
            return action()
        except (ServerCallError, process.ServerError, RuntimeError) as error:
            raise self._down(f"{doing}: {str(error).splitlines()[0]}") from None

    def _down(self, message: str) -> GeneratorDown:
        """The run's failure line, naming the log of each server tokenpo started (vLLM's cause is there: a request
        that failed says only that the server's engine died)."""
        self.failed = True
        logs = [str(server.log_path) for server in self.servers
                if server.log_path is not None and str(server.log_path) not in message]
        return GeneratorDown(message + (f"; its log: {', '.join(logs)}" if logs else ""))

    def check(self) -> None:
        for server in self.servers:
            try:
                process.check(server)
            except process.ServerError as error:
                raise self._down(str(error)) from None

    # --- Generator ---

    def load(self, published: Published) -> None:
        """Version `published.version` pushed to every server (every rank reads the weights); a version the servers
        hold already is not pushed again (the run's start loads the version the engine was built with)."""
        if published.version == self.version:
            return
        self.resumed.clear()
        try:  # every rank reads the weights; only rank 0 can fail (its caller agrees: tokenpo.trainer.core.source)
            stats = self._guarded(f"pushing policy version {published.version} to {', '.join(self.urls)}",
                                  lambda: self.push.push(published, self.server_cfg.in_flight))
        finally:
            self.resumed.set()
        self.version = published.version
        self.measured["timing/weight_push_s"].append(stats.seconds)
        self.measured["timing/weight_push_drain_s"].append(stats.drain_s)
        self.measured["rollout/weight_push_mib"].append(stats.mib)

    def submit(self, request: GenerateRequest) -> None:
        if request.key in self.done:  # restored from a checkpoint with its result
            return
        self._initial_pushed()
        if request.version != self.version:
            raise RuntimeError(f"rollout engine: request {request.key} needs policy version {request.version}, the "
                               f"servers hold {self.version}")
        rng = torch.Generator().manual_seed(request.seed)
        futures = self._requests(request.prompt_ids, request.params, rng)
        self.pending[request.key] = (request, futures, time.perf_counter())

    def result(self, key: tuple[int, int]) -> tuple[Generated, float]:
        if key in self.done:
            return self.done.pop(key), 0.0
        request, futures, submitted = self.pending.pop(key)
        started = time.perf_counter()
        per_prompt = self._wait(futures)
        responses = responses_of(per_prompt)
        # a partial rollout's oldest version: the staleness it counts is its oldest token's
        versions = [v for row in responses.token_versions for v in row] or [request.version]
        return (Generated(key, responses, min(versions), 0.0, time.perf_counter() - submitted),
                time.perf_counter() - started)

    def sample(self, prompt_ids, params: SamplingParams, rng: torch.Generator) -> Responses:
        self._initial_pushed()
        return responses_of(self._wait(self._requests(prompt_ids, params, rng)))

    def sleep(self) -> None:
        pass  # the servers' devices are their own: nothing to give the update

    def wake_up(self) -> None:
        pass

    def _initial_pushed(self) -> None:
        """The version the engine was built with on the servers, if no `load` came first (every rank makes the same
        requests: the push's reads are collectives)."""
        if self.version < 0:
            agreed(self.load, self.initial)

    def state_dict(self) -> dict:
        """Every submitted request's result, waited for: a resumed run takes them back. With a server down, the
        requests it had are left out (the resumed run samples them again)."""
        try:
            for key in sorted(self.pending):
                self.done[key] = self.result(key)[0]
        except GeneratorDown:
            self.pending.clear()
        return results_state(self.done)

    def load_state_dict(self, state: dict) -> None:
        self.done.update(restored_results(state))

    def take_metrics(self) -> dict[str, float]:
        taken, self.measured = self.measured, defaultdict(list)
        return {key: float(sum(values)) for key, values in taken.items()}

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
        if self.push is not None:
            self.push.close()
        process.stop(*self.servers)
        if self.launched is not None:
            self.launched.close()
        for server in self.servers:
            if server.log_path is not None and not self.failed:
                shutil.rmtree(server.log_path.parent, ignore_errors=True)

    # --- requests ---

    def _requests(self, prompt_ids: list[list[int]], params: SamplingParams, rng: torch.Generator) -> list[Future]:
        """One request per prompt, to the servers in turn, each with a seed drawn from `rng`."""
        seeds = torch.randint(SEED_RANGE, (len(prompt_ids),), generator=rng, device=rng.device).tolist()
        return [self.pool.submit(self._generate, self.urls[index % len(self.urls)], prompt, params, seed)
                for index, (prompt, seed) in enumerate(zip(prompt_ids, seeds))]

    def _generate(self, url: str, prompt: list[int], params: SamplingParams, seed: int) -> list[Sample]:
        """The prompt's samples; dropped by a push (in_flight=abort), sampled again once the push is done."""
        while True:
            self.resumed.wait()
            out = generate(url, prompt, params, seed, self.server_cfg.request_timeout_s, self.version)
            if not any(sample.aborted for sample in out):
                return out
            self.measured["rollout/requests_resampled"].append(1.0)

    def _wait(self, futures: list[Future]) -> list[list[Sample]]:
        """The futures' samples, the servers' health checked while they run: a dead server is one line, not a hang."""
        pending = set(futures)
        while pending:
            finished, pending = wait(pending, timeout=HEALTH_POLL_S, return_when=FIRST_EXCEPTION)
            failed = next((f.exception() for f in finished if f.exception() is not None), None)
            if failed is not None:
                raise self._down(str(failed).splitlines()[0]) from None
            if pending:
                self.check()
        return [future.result() for future in futures]


def responses_of(per_prompt: list[list[Sample]]) -> Responses:
    """Samples prompt-major, as every engine returns them."""
    rows = [sample for samples in per_prompt for sample in samples]
    return Responses(token_ids=[row.token_ids for row in rows], truncated=[row.truncated for row in rows],
                     logprobs=[row.logprobs for row in rows], token_versions=[row.versions for row in rows])

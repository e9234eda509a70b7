"""Score responses in worker processes, with a hard time limit per response.

Processes, not threads: the per-response timer (tokenpo.rewards.judging._time_limit) is a signal, which works
only in a process's main thread, and a response stuck inside C code (sympy, huge integers) can only be
stopped by killing its process. Workers are also replaced after reward.worker_max_items responses or above
reward.worker_max_rss_mb: sympy's caches make a long-lived worker grow without bound.
"""

import logging
import math
import multiprocessing
import signal
import sys
import time
import types
from collections import deque
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Protocol, Sequence

import psutil

from tokenpo.errors import ConfigError
from tokenpo.rewards.config import RewardConfig
from tokenpo.rewards.judging import expression_libraries, judge
from tokenpo.rewards.spec import AnswerSpec, answer_spec
from tokenpo.rewards.user_fn import load_reward_fn, user_fn_verdict
from tokenpo.rewards.verdicts import ERROR, TIMEOUT

logger = logging.getLogger(__name__)

# How long past reward.timeout_s a worker may run before it is killed: its own timer fires at timeout_s to
# the millisecond (tokenpo.rewards.judging._time_limit), so this only covers sending that verdict back.
KILL_GRACE_S = 0.5


def _worker_main(conn: Connection, fn_path: str | None, spec: AnswerSpec) -> None:
    """Worker process: score (response, gold) jobs from `conn` until it sends None or closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the trainer's to handle; it stops the workers
    try:
        user_fn = None if fn_path is None else load_reward_fn(fn_path)
    except ConfigError as error:
        conn.send(("init_error", str(error)))
        return
    if user_fn is None and spec.answer_format != "number":
        expression_libraries()  # math-verify's import (a second or more) before "ready", outside any item's clock
    conn.send(("ready", None))
    while True:
        try:
            job = conn.recv()
        except EOFError:
            return
        if job is None:
            return
        response, gold = job
        try:
            if user_fn is not None:
                outcome = (user_fn_verdict(user_fn, response, gold), None)
            else:
                outcome = (judge(response, gold, spec), None)
        except Exception as error:
            outcome = (ERROR, f"{type(error).__name__}: {error}")
        conn.send(outcome)


def _start_without_main(process: multiprocessing.process.BaseProcess) -> None:
    """Start a spawn process without re-running the parent's __main__ in it.

    spawn re-imports the parent's main module in each child; for the trainer that module imports torch,
    transformers and deepspeed (seconds and hundreds of MB per worker), while a worker needs only this
    package. __main__ is swapped for an empty module only while the child's start-up data is taken.
    """
    main = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        process.start()
    finally:
        sys.modules["__main__"] = main


@dataclass
class _Worker:
    process: multiprocessing.process.BaseProcess
    conn: Connection
    ready: bool = False
    job: int | None = None  # index in the batch of the response being scored
    deadline: float = math.inf  # monotonic time at which the job is declared TIMEOUT and the worker killed
    items: int = 0  # responses scored, counted for reward.worker_max_items


@dataclass
class _Batch:
    """One score() call's progress: responses not yet sent to a worker, and the verdicts so far."""

    pending: deque  # (index, response, gold) not yet sent to a worker
    verdicts: list
    missing: int
    errors: dict[int, str] = field(default_factory=dict)  # index -> why that response scored ERROR


class Scorer(Protocol):
    def score(self, responses: Sequence[str], golds: Sequence[str]) -> list[str]:
        """One verdict (tokenpo.rewards.verdicts) per response against its gold, in order."""


class RewardScorer:
    """Scores batches of (response, gold) in `cfg.num_workers` processes, reused across batches.

    A response that runs past `cfg.timeout_s` scores TIMEOUT and its worker is replaced, so a batch waits
    at most about timeout_s + KILL_GRACE_S longer per round of pathological responses.
    """

    def __init__(self, cfg: RewardConfig):
        cfg.validate()
        spec = answer_spec(cfg)
        if cfg.fn is not None:
            load_reward_fn(cfg.fn)  # a bad path fails here, at start-up, rather than in every worker
        self.config = cfg  # what it judges by: a caller with another config needs its own scorer
        self._worker_args = (cfg.fn, spec)
        self._item_limit_s = cfg.timeout_s + KILL_GRACE_S
        self._max_items = cfg.worker_max_items
        self._max_rss_bytes = None if cfg.worker_max_rss_mb is None else cfg.worker_max_rss_mb * 2**20
        # spawn, not fork: the parent runs torch threads, which a forked child would inherit in a broken state
        self._context = multiprocessing.get_context("spawn")
        self._failure: str | None = None  # why the pool can no longer score; score() raises it
        self._closed = False
        # started now, so they load (math-verify: a second or more) while the caller prepares the first batch
        self._workers = [self._start_worker() for _ in range(cfg.num_workers)]

    def score(self, responses: Sequence[str], golds: Sequence[str]) -> list[str]:
        """The verdicts of `responses` against `golds`, in order; blocks until all are in."""
        if len(responses) != len(golds):
            raise ValueError(f"got {len(responses)} responses but {len(golds)} gold answers")
        if self._closed:
            raise RuntimeError("RewardScorer is closed")
        if self._failure is not None:
            raise RuntimeError(self._failure)
        batch = _Batch(deque(zip(range(len(responses)), responses, golds)), [None] * len(responses), len(responses))
        try:
            while batch.missing and self._failure is None:
                self._step(batch)
        except BaseException as error:
            # workers may still hold this batch's responses, whose verdicts would reach the next batch: stop them
            self._failure = f"reward scoring was interrupted: {type(error).__name__}: {error}"
            self._stop_workers()
            raise
        if batch.missing:
            self._stop_workers()
            raise RuntimeError(self._failure)
        if batch.errors:
            first = batch.errors[min(batch.errors)]
            logger.warning(
                "reward: %d of %d responses scored 'error'; first: %s", len(batch.errors), len(responses), first
            )
        return batch.verdicts

    def worker_pids(self) -> list[int]:
        """Process ids of the current workers (replaced ones are gone), e.g. to watch their memory."""
        return [worker.process.pid for worker in self._workers]

    def close(self) -> None:
        """Stop the workers."""
        if self._closed:
            return
        self._closed = True
        self._stop_workers()

    def __enter__(self) -> "RewardScorer":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def _step(self, batch: _Batch) -> None:
        """Send idle workers the next responses, then wait for a verdict or the earliest deadline."""
        self._send_jobs(batch)
        deadlines = [worker.deadline for worker in self._workers if worker.job is not None]
        wait_s = max(0.0, min(deadlines) - time.monotonic()) if deadlines else None
        for conn in wait([worker.conn for worker in self._workers], wait_s):
            self._receive(next(worker for worker in self._workers if worker.conn is conn), batch)
        self._kill_overdue(batch)

    def _start_worker(self) -> _Worker:
        parent_conn, child_conn = self._context.Pipe()
        process = self._context.Process(
            target=_worker_main, args=(child_conn, *self._worker_args), name="tokenpo-reward-worker", daemon=True
        )
        _start_without_main(process)
        child_conn.close()  # only the worker holds its end now, so its death reads as EOF here
        return _Worker(process, parent_conn)

    def _replace(self, worker: _Worker) -> None:
        worker.process.kill()
        worker.process.join()
        worker.conn.close()
        self._workers[self._workers.index(worker)] = self._start_worker()

    def _send_jobs(self, batch: _Batch) -> None:
        for worker in list(self._workers):
            if not batch.pending:
                return
            if worker.ready and worker.job is None:
                index, response, gold = batch.pending.popleft()
                try:
                    worker.conn.send((response, gold))
                except OSError:  # the worker died while idle
                    batch.pending.appendleft((index, response, gold))
                    self._on_worker_death(worker, batch)
                    continue
                worker.job, worker.deadline = index, time.monotonic() + self._item_limit_s

    def _receive(self, worker: _Worker, batch: _Batch) -> None:
        try:
            kind, detail = worker.conn.recv()
        except (EOFError, OSError):
            self._on_worker_death(worker, batch)
            return
        if not worker.ready:
            if kind == "ready":
                worker.ready = True
            else:
                self._failure = detail  # the user function failed to load in the worker
            return
        _record(batch, worker.job, kind, detail)
        worker.job, worker.deadline = None, math.inf
        worker.items += 1
        if self._worn_out(worker):
            self._replace(worker)

    def _worn_out(self, worker: _Worker) -> bool:
        """True once an idle worker has scored reward.worker_max_items responses or holds over worker_max_rss_mb."""
        if self._max_items is not None and worker.items >= self._max_items:
            return True
        if self._max_rss_bytes is None:
            return False
        try:
            return psutil.Process(worker.process.pid).memory_info().rss > self._max_rss_bytes
        except psutil.Error:  # it exited just now; replace it
            return True

    def _on_worker_death(self, worker: _Worker, batch: _Batch) -> None:
        worker.process.join(timeout=1.0)
        if not worker.ready:
            # failing again and again at start-up would loop forever, so stop loudly instead
            self._failure = f"a reward worker exited while starting (exit code {worker.process.exitcode})"
            return
        if worker.job is not None:
            _record(batch, worker.job, ERROR, f"reward worker died (exit code {worker.process.exitcode})")
        self._replace(worker)

    def _kill_overdue(self, batch: _Batch) -> None:
        now = time.monotonic()
        for worker in list(self._workers):
            if worker.job is not None and now >= worker.deadline:
                _record(batch, worker.job, TIMEOUT, None)
                self._replace(worker)

    def _stop_workers(self) -> None:
        for worker in self._workers:
            if worker.job is None:
                try:
                    worker.conn.send(None)
                except OSError:
                    pass
        for worker in self._workers:
            worker.process.join(timeout=1.0)
            if worker.process.is_alive():
                worker.process.kill()
                worker.process.join()
            worker.conn.close()
        self._workers = []


def _record(batch: _Batch, index: int, verdict: str, error: str | None) -> None:
    batch.verdicts[index] = verdict
    batch.missing -= 1
    if error is not None:
        batch.errors[index] = error

"""Score responses in worker processes while the trainer generates, with a hard time limit per response.

Processes, not threads: the per-response timer (tokenpo.rewards.verify._time_limit) is a signal, which works
only in a process's main thread, and a response stuck inside C code (sympy, huge integers) can only be
stopped by killing its process. Workers are also replaced after reward.worker_max_items responses or above
reward.worker_max_rss_mb: sympy's caches make a long-lived worker grow without bound.
"""

import logging
import math
import multiprocessing
import signal
import sys
import threading
import time
import types
from collections import deque
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Sequence

import psutil

from tokenpo.errors import ConfigError
from tokenpo.rewards.config import DATASET_FIELDS, RewardConfig
from tokenpo.rewards.user_fn import load_reward_fn, user_fn_verdict
from tokenpo.rewards.verdicts import ERROR, TIMEOUT
from tokenpo.rewards.verify import expression_libraries, judge

logger = logging.getLogger(__name__)

# How long past reward.timeout_s a worker may run before it is killed: its own timer fires at timeout_s to
# the millisecond (tokenpo.rewards.verify._time_limit), so this only covers sending that verdict back.
KILL_GRACE_S = 0.5


def _worker_main(conn: Connection, fn_path: str | None, judge_kwargs: dict) -> None:
    """Worker process: score (response, gold) jobs from `conn` until it sends None or closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the trainer's to handle; it stops the workers
    try:
        user_fn = None if fn_path is None else load_reward_fn(fn_path)
    except ConfigError as error:
        conn.send(("init_error", str(error)))
        return
    if user_fn is None and judge_kwargs["answer_format"] != "number":
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
                outcome = (judge(response, gold, **judge_kwargs), None)
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
    job: tuple[int, int] | None = None  # (handle, index) being scored
    deadline: float = math.inf  # monotonic time at which the job is declared TIMEOUT and the worker killed
    items: int = 0  # responses scored, counted for reward.worker_max_items


class RewardScorer:
    """Scores batches of (response, gold) in `cfg.num_workers` processes, reused across steps.

    submit() returns at once, so scoring overlaps the next generation; result() waits for the verdicts.
    A response that runs past `cfg.timeout_s` scores TIMEOUT and its worker is replaced, so a batch waits
    at most about timeout_s + KILL_GRACE_S longer per round of pathological responses.
    """

    def __init__(self, cfg: RewardConfig):
        cfg.validate()
        for name in DATASET_FIELDS:
            if getattr(cfg, name) is None:
                raise ConfigError(
                    f"reward.{name} is null: pass the config through resolve() with the dataset's defaults"
                )
        if cfg.fn is not None:
            load_reward_fn(cfg.fn)  # a bad path fails here, at start-up, rather than in every worker
        judge_kwargs = {name: getattr(cfg, name)
                        for name in (*DATASET_FIELDS, "reasoning_tag", "timeout_s", "decimal_tolerance")}
        self._worker_args = (cfg.fn, judge_kwargs)
        self._item_limit_s = cfg.timeout_s + KILL_GRACE_S
        self._max_items = cfg.worker_max_items
        self._max_rss_bytes = None if cfg.worker_max_rss_mb is None else cfg.worker_max_rss_mb * 2**20
        # spawn, not fork: the parent runs torch threads, which a forked child would inherit in a broken state
        self._context = multiprocessing.get_context("spawn")
        self._lock = threading.Condition()
        self._queue: deque = deque()  # (handle, index, response, gold) not yet sent to a worker
        self._verdicts: dict[int, list] = {}
        self._missing: dict[int, int] = {}
        self._errors: dict[int, dict[int, str]] = {}  # handle -> index -> why that response scored ERROR
        self._next_handle = 0
        self._failure: str | None = None  # why the pool can no longer score; result() raises it
        self._closing = False
        self._wake_recv, self._wake_send = self._context.Pipe(duplex=False)
        self._workers = [self._start_worker() for _ in range(cfg.num_workers)]
        self._dispatcher = threading.Thread(target=self._dispatch, name="tokenpo-reward-dispatch", daemon=True)
        self._dispatcher.start()

    def submit(self, responses: Sequence[str], golds: Sequence[str]) -> int:
        """Queue a batch for scoring; returns a handle for result() at once."""
        if len(responses) != len(golds):
            raise ValueError(f"got {len(responses)} responses but {len(golds)} gold answers")
        with self._lock:
            if self._closing:
                raise RuntimeError("RewardScorer is closed")
            if self._failure is not None:
                raise RuntimeError(self._failure)
            handle = self._next_handle
            self._next_handle += 1
            self._verdicts[handle] = [None] * len(responses)
            self._missing[handle] = len(responses)
            for index, (response, gold) in enumerate(zip(responses, golds)):
                self._queue.append((handle, index, response, gold))
            self._wake_send.send(None)
        return handle

    def result(self, handle: int) -> list[str]:
        """The verdicts of a submitted batch, in order, once all are in."""
        with self._lock:
            if handle not in self._verdicts:
                raise KeyError(f"unknown or already collected reward handle {handle!r}")
            while self._missing[handle] and self._failure is None:
                self._lock.wait()
            if self._missing[handle]:
                raise RuntimeError(self._failure)
            verdicts = self._verdicts.pop(handle)
            del self._missing[handle]
            errors = self._errors.pop(handle, {})
        if errors:
            first = errors[min(errors)]
            logger.warning(
                "reward: %d of %d responses scored 'error'; first: %s", len(errors), len(verdicts), first
            )
        return verdicts

    def worker_pids(self) -> list[int]:
        """Process ids of the current workers (replaced ones are gone), e.g. to watch their memory."""
        with self._lock:
            return [worker.process.pid for worker in self._workers]

    def close(self) -> None:
        """Stop the workers; batches still being scored can no longer be collected."""
        with self._lock:
            if self._closing:
                return
            self._closing = True
            self._failure = self._failure or "RewardScorer was closed before this batch was scored"
            self._wake_send.send(None)
            self._lock.notify_all()
        self._dispatcher.join()
        self._wake_send.close()
        self._wake_recv.close()

    def __enter__(self) -> "RewardScorer":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    # The methods below run in the dispatcher thread; those touching shared state hold self._lock.

    def _dispatch(self) -> None:
        try:
            while True:
                with self._lock:
                    if self._closing or self._failure is not None:
                        return
                    self._send_jobs()
                    deadlines = [worker.deadline for worker in self._workers if worker.job is not None]
                    conns = [worker.conn for worker in self._workers]
                wait_s = max(0.0, min(deadlines) - time.monotonic()) if deadlines else None
                ready = wait(conns + [self._wake_recv], wait_s)
                with self._lock:
                    for conn in ready:
                        if conn is self._wake_recv:
                            while self._wake_recv.poll():
                                self._wake_recv.recv()
                        else:
                            self._receive(next(worker for worker in self._workers if worker.conn is conn))
                    self._kill_overdue()
                    self._lock.notify_all()
        except Exception as error:  # never leave result() waiting on a dead dispatcher
            with self._lock:
                self._failure = f"reward dispatcher failed: {type(error).__name__}: {error}"
                self._lock.notify_all()
        finally:
            self._stop_workers()

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

    def _send_jobs(self) -> None:
        for worker in list(self._workers):
            if not self._queue:
                return
            if worker.ready and worker.job is None:
                job = self._queue.popleft()
                try:
                    worker.conn.send(job[2:])
                except OSError:  # the worker died while idle
                    self._queue.appendleft(job)
                    self._on_worker_death(worker)
                    continue
                worker.job, worker.deadline = job[:2], time.monotonic() + self._item_limit_s

    def _receive(self, worker: _Worker) -> None:
        try:
            kind, detail = worker.conn.recv()
        except (EOFError, OSError):
            self._on_worker_death(worker)
            return
        if not worker.ready:
            if kind == "ready":
                worker.ready = True
            else:
                self._failure = detail  # the user function failed to load in the worker
            return
        self._record(worker.job, kind, detail)
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

    def _on_worker_death(self, worker: _Worker) -> None:
        worker.process.join(timeout=1.0)
        if not worker.ready:
            # failing again and again at start-up would loop forever, so stop loudly instead
            self._failure = f"a reward worker exited while starting (exit code {worker.process.exitcode})"
            return
        if worker.job is not None:
            self._record(worker.job, ERROR, f"reward worker died (exit code {worker.process.exitcode})")
        self._replace(worker)

    def _kill_overdue(self) -> None:
        now = time.monotonic()
        for worker in list(self._workers):
            if worker.job is not None and now >= worker.deadline:
                self._record(worker.job, TIMEOUT, None)
                self._replace(worker)

    def _record(self, job: tuple[int, int], verdict: str, error: str | None) -> None:
        handle, index = job
        self._verdicts[handle][index] = verdict
        self._missing[handle] -= 1
        if error is not None:
            self._errors.setdefault(handle, {})[index] = error

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

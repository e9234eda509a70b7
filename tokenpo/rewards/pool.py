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
from tokenpo.rewards.weighted import load_functions, weighted_score

logger = logging.getLogger(__name__)
# the score of a response that timed out, or whose scoring failed: nothing earned, as a wrong answer (it stays in the
# loss, as those verdicts always have)
FAILED_SCORE = 0.0

# How long past reward.timeout_s a worker may run before it is killed: its own timer fires at timeout_s to
# the millisecond (tokenpo.rewards.judging._time_limit), so this only covers sending that verdict back.
KILL_GRACE_S = 0.5


def _worker_main(conn: Connection, fn_path: str | None, spec: AnswerSpec, entries: tuple) -> None:
    """Worker process: score (response, gold, prompt, fields, scored) jobs from `conn` until it sends None or closes:
    each one's verdict, error text and (where `scored`) score, reward.functions' weighted sum."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the trainer's to handle; it stops the workers
    try:
        user_fn = None if fn_path is None else load_reward_fn(fn_path)
        functions = load_functions(entries)
    except ConfigError as error:
        conn.send(("init_error", str(error), None))
        return
    if user_fn is None and spec.answer_format != "number":
        expression_libraries()  # math-verify's import (a second or more) before "ready", outside any item's clock
    conn.send(("ready", None, None))
    while True:
        try:
            job = conn.recv()
        except EOFError:
            return
        if job is None:
            return
        response, gold, prompt, fields, scored = job
        try:
            verdict = user_fn_verdict(user_fn, response, gold) if user_fn is not None else judge(response, gold, spec)
            score = weighted_score(functions, verdict, response, gold, prompt, fields) if scored else None
            outcome = (verdict, None, score)
        except Exception as error:
            outcome = (ERROR, f"{type(error).__name__}: {error}", FAILED_SCORE)
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

    pending: deque  # (index, job) not yet sent to a worker; a job: (response, gold, prompt, fields, scored)
    verdicts: list
    scores: list
    missing: int
    errors: dict[int, str] = field(default_factory=dict)  # index -> why that response scored ERROR


class Scorer(Protocol):
    def score(self, responses: Sequence[str], golds: Sequence[str]) -> list[str]:
        """One verdict (tokenpo.rewards.verdicts) per response against its gold, in order."""


@dataclass(frozen=True)
class Judged:
    """Responses judged: each one's verdict and score (reward.functions' weighted sum; None: out of the loss)."""

    verdicts: list[str]
    scores: list[float | None]


@dataclass(frozen=True)
class Question:
    """What a response answers, as reward functions read it: the gold answer, the prompt's problem text and the
    example's other fields."""

    gold: str
    prompt: str = ""
    fields: dict = field(default_factory=dict)


def question(example) -> Question:
    """The question of a data example (tokenpo.data.Example: its answer, problem text and meta fields)."""
    return Question(example.answer, example.problem, dict(example.meta))


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
        load_functions(cfg.functions)
        self.config = cfg  # what it judges by: a caller with another config needs its own scorer
        self._worker_args = (cfg.fn, spec, tuple(dict(entry) for entry in cfg.functions))
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
        return self.judge(responses, [Question(gold) for gold in golds], scored=False).verdicts

    def judge(self, responses: Sequence[str], questions: Sequence[Question], scored: bool = True) -> Judged:
        """Each response's verdict against its question's gold and (`scored`) its score, reward.functions' weighted
        sum, in order; blocks until all are in."""
        if len(responses) != len(questions):
            raise ValueError(f"got {len(responses)} responses but {len(questions)} questions")
        if self._closed:
            raise RuntimeError("RewardScorer is closed")
        if self._failure is not None:
            raise RuntimeError(self._failure)
        jobs = [(response, q.gold, q.prompt, q.fields, scored) for response, q in zip(responses, questions)]
        batch = _Batch(deque(enumerate(jobs)), [None] * len(responses), [None] * len(responses), len(responses))
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
        return Judged(batch.verdicts, batch.scores)

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
                index, job = batch.pending.popleft()
                try:
                    worker.conn.send(job)
                except OSError:  # the worker died while idle
                    batch.pending.appendleft((index, job))
                    self._on_worker_death(worker, batch)
                    continue
                worker.job, worker.deadline = index, time.monotonic() + self._item_limit_s

    def _receive(self, worker: _Worker, batch: _Batch) -> None:
        try:
            kind, detail, score = worker.conn.recv()
        except (EOFError, OSError):
            self._on_worker_death(worker, batch)
            return
        if not worker.ready:
            if kind == "ready":
                worker.ready = True
            else:
                self._failure = detail  # the user function failed to load in the worker
            return
        _record(batch, worker.job, kind, detail, score)
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
            _record(batch, worker.job, ERROR, f"reward worker died (exit code {worker.process.exitcode})", FAILED_SCORE)
        self._replace(worker)

    def _kill_overdue(self, batch: _Batch) -> None:
        now = time.monotonic()
        for worker in list(self._workers):
            if worker.job is not None and now >= worker.deadline:
                _record(batch, worker.job, TIMEOUT, None, FAILED_SCORE)
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


def _record(batch: _Batch, index: int, verdict: str, error: str | None, score: float | None) -> None:
    batch.verdicts[index] = verdict
    batch.scores[index] = score
    batch.missing -= 1
    if error is not None:
        batch.errors[index] = error

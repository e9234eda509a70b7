"""Stop signals: the run saves a checkpoint and exits at the end of its current step (`StopRequest`); a job's
launcher forwards them to its workers (tokenpo.trainer.processes.launch)."""

from __future__ import annotations

import logging
import signal

log = logging.getLogger("tokenpo")

# signals that stop a run after its current step, with a checkpoint: a terminal's or a scheduler's stop (SIGTERM,
# Ctrl-C) and the warnings sent before a time limit or a preemption: `sbatch --signal=USR1@120` (SIGUSR1, Lightning's
# requeue signal) and submitit's (SIGUSR2, its default SUBMITIT_PREEMPT_SIGNAL)
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2)


class StopRequest:
    """A stop signal (SIGTERM, SIGINT, SIGUSR1, SIGUSR2) asks the loop to save and exit at the end of the current step.
    `restore` puts back the handlers the process had before (submitit's SIGUSR2 handler, which requeues the job)."""

    def __init__(self) -> None:
        self.requested = False
        self.signum: int | None = None
        self.previous = {sig: signal.signal(sig, self._handle) for sig in STOP_SIGNALS}

    def _handle(self, signum, frame) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested, self.signum = True, signum
        log.warning("signal %d: saving a checkpoint after this step, then exiting", signum)

    def restore(self) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)

    # a run that ends in an error (a dead generator, a health stop) puts the handlers back too: the process, or a
    # sweep's next job in it, gets its own (submitit's requeue) again
    def __enter__(self) -> StopRequest:
        return self

    def __exit__(self, *exc) -> None:
        self.restore()

"""A child process that dies with its parent, however the parent died (SIGKILL and the OOM killer included).

Used by the local workers of a `trainer.nproc=N` job (`tokenpo.trainer.processes.launch.die_with_launcher`) and by
the generation-ahead process (`tokenpo.rollout.ahead`): either, left running, would train or sample on for nobody.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time

# prctl option from <linux/prctl.h>: the signal this process gets when its parent dies
PR_SET_PDEATHSIG = 1
# seconds between parent checks where PR_SET_PDEATHSIG is unavailable
PARENT_POLL_S = 0.5


def die_with_parent(parent: int) -> None:
    """Called first in a child of `parent` (a pid): SIGKILL it as soon as that parent dies.

    Linux: the kernel sends the signal (PR_SET_PDEATHSIG; it tracks the thread that started the child, so the parent
    must start it from a thread that lives as long as the parent). Elsewhere a daemon thread polls the parent pid."""
    prctl = getattr(ctypes.CDLL(None, use_errno=True), "prctl", None) if sys.platform == "linux" else None
    if prctl is not None:
        if prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL)) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    else:
        threading.Thread(target=_watch_parent, args=(parent,), name="tokenpo-watch-parent", daemon=True).start()
    # the parent may have died before the line above: the child was re-parented already
    if os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGKILL)


def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(PARENT_POLL_S)
    os.kill(os.getpid(), signal.SIGKILL)

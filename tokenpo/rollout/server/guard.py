"""The wrapper every server that tokenpo starts runs under: `python -I <this file> PARENT GRACE_S COMMAND...` (or
`python -m tokenpo.rollout.server.guard ...`) runs COMMAND and takes its whole process tree down with it when the
trainer (pid PARENT) dies, however it dies.

A server such as `vllm serve` starts processes of its own (the API server spawns an engine core), and the trainer
may die by SIGKILL, which runs no handler. So the guard, not the trainer, does the stopping: it asks the kernel for a
SIGTERM when the trainer dies (PR_SET_PDEATHSIG; SIGTERM, unlike SIGKILL, can be caught), and on it sends SIGTERM to
its process group, waits up to GRACE_S seconds and then sends SIGKILL. The trainer starts the guard as the leader of
a new session and process group (`tokenpo.rollout.server.process.start`), which COMMAND and everything it starts
inherit: one group holds the tree, and the trainer can signal it as a whole too (a descendant that starts a group
of its own gets the guard's signals one by one). The guard is also a child subreaper (PR_SET_CHILD_SUBREAPER): a
process the server leaves behind (its engine core, when the server itself dies) becomes the guard's child, so the
guard sees it, waits for it and reaps it. COMMAND gets a SIGTERM of its own when the guard dies (the OOM killer),
the same way.

When COMMAND exits by itself, the guard stops what it left and exits as COMMAND did (its code, or killed by the same
signal), so the trainer sees the server's end in the guard's. The guard writes what it does to its stderr, the
server's log. It imports nothing but the standard library and runs as a file in isolated mode (`python -I`), so it
starts however tokenpo was made importable in the trainer and whatever PYTHON* variables the server's environment
holds. Linux only (prctl).
"""

from __future__ import annotations

import ctypes
import os
import resource
import signal
import sys
import time
import traceback

# prctl options from <linux/prctl.h> (PR_SET_PDEATHSIG as in tokenpo.lifeline): the signal this process gets when
# its parent dies; orphaned descendants are re-parented to this process instead of to init
PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
# the signals that ask the guard to stop the tree: the parent-death signal, `process.stop`, a person's kill
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
# seconds between looks at the children (and at a stop request, which a signal handler records)
POLL_S = 0.1


def command(parent: int, grace_s: float, argv: list[str]) -> list[str]:
    """The command line that runs `argv` under a guard of `parent` (a pid) with a stop grace of `grace_s` seconds."""
    return [sys.executable, "-I", os.path.abspath(__file__), str(parent), repr(float(grace_s)), *argv]


def prctl(option: int, value: int) -> None:
    if ctypes.CDLL(None, use_errno=True).prctl(option, value) != 0:
        raise OSError(ctypes.get_errno(), f"prctl({option}, {value}) failed")


def say(text: str) -> None:
    try:
        print(f"tokenpo guard (pid {os.getpid()}): {text}", file=sys.stderr, flush=True)
    except OSError:  # a full disk must not stop the guard
        pass


def main(argv: list[str]) -> int:
    parent, grace_s, server_argv = int(argv[0]), float(argv[1]), argv[2:]
    requested: list[int] = []  # the stop signals received (a handler only records them: it may run anywhere)
    for signum in STOP_SIGNALS:
        signal.signal(signum, lambda received, frame: requested.append(received))
    if os.getpgrp() != os.getpid():  # started by hand: its signals to "its group" must not reach the caller's
        os.setsid()
    prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    prctl(PR_SET_CHILD_SUBREAPER, 1)
    if os.getppid() != parent:  # the trainer died before the lines above: nobody is left to serve
        say(f"the trainer (pid {parent}) is gone; not starting {server_argv[0]}")
        return 1
    server = spawn(server_argv)
    say(f"started {' '.join(server_argv)} as pid {server}")
    status = wait_for(server, requested)
    if status is None:
        say(f"got {signal.Signals(requested[0]).name} (the trainer stopped the server or died): stopping its tree")
        stop_group(grace_s)
        return 0
    say(f"the server (pid {server}) {describe(os.waitstatus_to_exitcode(status))}; stopping what it left")
    stop_group(grace_s)
    return exit_like(status)


def spawn(argv: list[str]) -> int:
    """`argv` started as a child in the guard's process group; it gets SIGTERM when the guard dies."""
    pid = os.fork()
    if pid == 0:
        try:
            for signum in STOP_SIGNALS:
                signal.signal(signum, signal.SIG_DFL)
            prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
            os.execvp(argv[0], argv)
        except BaseException as error:  # noqa: B036 (the child must end here, whatever happened)
            say(f"cannot run {argv[0]}: {error}")
        os._exit(127)
    return pid


def wait_for(server: int, requested: list[int]) -> int | None:
    """The server's wait status once it exits, or None once a stop is requested first. Reaps on the way the
    processes the server leaves to the guard (the subreaper)."""
    while not requested:
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == server:
            return status
        if pid == 0:
            time.sleep(POLL_S)
    return None


def stop_group(grace_s: float) -> None:
    """SIGTERM to the guard's tree, up to `grace_s` seconds for its children to exit, then SIGKILL to the tree, the
    guard included (nothing is left to wait for)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the group's SIGTERM is for the others
    signal_tree(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while has_children():
        if time.monotonic() >= deadline:
            say(f"still running {grace_s:g} s after SIGTERM: SIGKILL to the tree")
            signal_tree(signal.SIGKILL)
        time.sleep(POLL_S)


def signal_tree(signum: int) -> None:
    """`signum` to the guard's process group (the guard included) and to each descendant that left it (vLLM's
    data-parallel API servers start groups of their own); once each, as a second SIGTERM may cut a server's own
    shutdown short."""
    for pid in left_the_group():
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass
    os.killpg(0, signum)


def left_the_group() -> list[int]:
    """The pids of the guard's descendants in another process group than the guard's, from /proc."""
    children: dict[int, list[int]] = {}
    groups: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rpartition(")")[2].split()  # after the name, which may hold anything
            pid, parent, groups[pid] = int(entry), int(fields[1]), int(fields[2])
        except (OSError, ValueError, IndexError):  # not a process, or one that just ended
            continue
        children.setdefault(parent, []).append(pid)
    found, unvisited = [], [os.getpid()]
    while unvisited:
        for child in children.get(unvisited.pop(), []):
            found.append(child)
            unvisited.append(child)
    return [pid for pid in found if groups[pid] != os.getpgrp()]


def has_children() -> bool:
    """Whether a child of the guard is still running; reaps the ones that exited."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return False
        if pid == 0:
            return True


def describe(code: int) -> str:
    """How a process with exit code `code` (negative: killed by that signal, as subprocess reports it) ended."""
    if code >= 0:
        return f"exited with code {code}"
    try:
        return f"was killed by {signal.Signals(-code).name}"
    except ValueError:  # a real-time signal
        return f"was killed by signal {-code}"


def exit_like(status: int) -> int:
    """The guard's exit code for a server that ended with wait status `status`; a server killed by a signal gets the
    guard killed by the same signal."""
    code = os.waitstatus_to_exitcode(status)
    if code < 0:
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # the server's crash, not a core file of the guard
        if -code != signal.SIGKILL:  # its action is the default, and cannot be set
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        return 128 - code  # a signal whose default is not to terminate
    return code


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except Exception:
        say(traceback.format_exc())
        if os.getpgrp() == os.getpid():  # a guard that fails takes its group with it: no server is left unguarded
            os.killpg(0, signal.SIGKILL)
        raise

"""The lifecycle of the inference servers of `rollout=vllm_server`: the ones tokenpo starts and the ones it is given
by URL. Nothing here knows vLLM: a server is a command that answers GET <url>/health with 200 once it is ready.

`start` checks that the port is free, then runs the command under a guard (tokenpo.rollout.server.guard) that leads
a new process group holding the server and every process it starts, and that stops that whole tree when the trainer
dies, SIGKILL included. `wait_ready` polls /health until the server answers, `check` is the liveness check between
steps, and `stop` ends the tree (SIGTERM, then SIGKILL after the spec's grace); it also runs at the trainer's exit
(atexit), exceptions included, so the servers are gone, their GPU memory and ports free, when the trainer's process
ends. What fails raises a `ServerError` whose first line names the server and its log, and the log's last lines
follow: a server that dies or stops answering is one error, never a hang (every request has a timeout).

Start servers from the main thread: the kernel signals the guard when the thread that started it ends, not only
when the process does.
"""

from __future__ import annotations

import atexit
import errno
import http.client
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from tokenpo.rollout.server import guard
from tokenpo.rollout.server.client import OPENER

# seconds between GET /health polls while a server starts
POLL_S = 0.5
# seconds one GET /health may take while a server starts (one still loading may hold a connection unanswered)
READY_REQUEST_TIMEOUT_S = 2.0
# seconds between looks at a stopping server's process group
STOP_POLL_S = 0.05
# seconds `stop` gives the guard past the server's grace before it kills the process group itself, and the group
# after that SIGKILL
GUARD_SLACK_S = 5.0
KILL_WAIT_S = 5.0
# how much of the end of a server's log is read for its errors, and how many of those lines they quote
LOG_END_BYTES = 64 * 1024
LOG_TAIL_LINES = 10
# what a server's log says when its port is taken (Python's OSError, uvicorn's message), lower case
ADDRESS_IN_USE = "address already in use"
PORT_SETTING = "rollout.server.port"
# hosts that mean "listen on every address", and the loopback address a client reaches such a server on
EVERY_ADDRESS = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}


class ServerError(RuntimeError):
    """A server did not start, died or stopped answering; the message's first line names the server (and its log),
    the last lines of its log may follow."""


@dataclass(frozen=True)
class ServerSpec:
    """A server for `start`: `name` is what every message calls it ("vLLM server 0 (cuda:6,7)"); `env` is added to
    the trainer's environment (CUDA_VISIBLE_DEVICES, ...); `log_path` gets the command's stdout and stderr (and the
    guard's lines); `grace_s` is how long `stop` and the guard wait after SIGTERM before SIGKILL."""

    name: str
    command: tuple[str, ...]
    host: str
    port: int
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)
    grace_s: float = 10.0

    def __post_init__(self) -> None:
        if not self.command:
            raise ValueError(f"{self.name}: the server's command is empty")

    @property
    def url(self) -> str:
        host = EVERY_ADDRESS.get(self.host, self.host)
        return f"http://[{host}]:{self.port}" if ":" in host else f"http://{host}:{self.port}"


@dataclass(eq=False)
class Server:
    """A server started by `start` (`spec` and `process`, its guard, set) or given by URL (`given`: both None,
    never stopped here)."""

    name: str
    url: str
    spec: ServerSpec | None = None
    process: subprocess.Popen[bytes] | None = None
    stopped: bool = False

    @property
    def log_path(self) -> Path | None:
        return None if self.spec is None else self.spec.log_path


# the servers each process started, by pid: a child forked from the trainer inherits this and the exit hook, and
# must not stop the trainer's servers when it exits
STARTED: dict[int, list[Server]] = {}


def start(spec: ServerSpec) -> Server:
    """`spec`'s command started under its guard; returns at once (`wait_ready` waits for the server). Raises a
    ServerError, before starting anything, when the command is not found or the port is taken."""
    if sys.platform != "linux":
        raise ServerError(f"{spec.name}: tokenpo starts servers on Linux only (prctl); give a running one by URL")
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError(f"{spec.name}: start servers from the main thread (the guard stops a server when the "
                           f"thread that started it ends)")
    env = {**os.environ, **spec.env}
    if shutil.which(spec.command[0], path=env.get("PATH")) is None:
        raise ServerError(f"{spec.name}: command not found: {spec.command[0]}")
    check_port_free(spec)
    spec.log_path.parent.mkdir(parents=True, exist_ok=True)
    with spec.log_path.open("wb") as log:
        process = subprocess.Popen(guard.command(os.getpid(), spec.grace_s, list(spec.command)),
                                   stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                                   start_new_session=True)
    server = Server(spec.name, spec.url, spec, process)
    STARTED.setdefault(os.getpid(), []).append(server)
    return server


def check_port_free(spec: ServerSpec) -> None:
    """Raises a one-line ServerError when nothing could listen on `spec`'s host and port. Binds as servers do
    (SO_REUSEADDR: a port whose old connections wait out TIME_WAIT is free to them); a listener makes it taken."""
    try:
        family, _, _, _, address = socket.getaddrinfo(spec.host or None, spec.port, type=socket.SOCK_STREAM)[0]
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(address)
    except OSError as error:
        if error.errno == errno.EADDRINUSE:
            raise ServerError(f"{spec.name}: port {spec.port} on {spec.host} is taken (another process listens "
                              f"there); set {PORT_SETTING} to a free port") from None
        raise ServerError(f"{spec.name}: cannot listen on {spec.host}:{spec.port} "
                          f"({error.strerror or error})") from None


def given(url: str, name: str) -> Server:
    """A server started elsewhere, at `url`: health-checked, never stopped here."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ServerError(f"{name}: {url!r} is not the http(s) URL of a server")
    return Server(name, url.rstrip("/"))


def wait_ready(server: Server, timeout_s: float) -> None:
    """Returns once GET /health answers 200; polls every POLL_S. Raises a ServerError at once when the server's
    process exits, and when it is not ready after `timeout_s` seconds."""
    deadline = time.monotonic() + timeout_s
    while True:
        raise_if_exited(server, " during startup")
        problem = health_problem(server.url, READY_REQUEST_TIMEOUT_S)
        if problem is None:
            return
        if time.monotonic() >= deadline:
            raise_if_exited(server, " during startup")
            raise failure(server, f"is not ready after {timeout_s:g} s (GET /health: {problem})")
        time.sleep(POLL_S)


def check(server: Server, timeout_s: float = 5.0) -> None:
    """The liveness check between steps: raises a ServerError when the server was stopped, its process exited or
    GET /health does not answer 200 within `timeout_s` seconds."""
    raise_if_exited(server, "")
    problem = health_problem(server.url, timeout_s)
    if problem is not None:
        raise_if_exited(server, "")  # it may have died while we asked
        raise failure(server, f"is not healthy (GET /health: {problem})")


def health_problem(url: str, timeout_s: float) -> str | None:
    """None when GET <url>/health answers 200 within `timeout_s` seconds, else what went wrong, in a few words."""
    try:
        with OPENER.open(f"{url}/health", timeout=timeout_s) as response:
            status = response.status
    except urllib.error.HTTPError as error:
        error.close()
        return f"HTTP {error.code}"
    except urllib.error.URLError as error:
        return no_answer(error.reason, timeout_s)
    except (OSError, http.client.HTTPException) as error:
        return no_answer(error, timeout_s)
    return None if status == 200 else f"HTTP {status}"


def no_answer(reason: object, timeout_s: float) -> str:
    if isinstance(reason, TimeoutError):
        return f"no answer within {timeout_s:g} s"
    return getattr(reason, "strerror", None) or str(reason) or type(reason).__name__


def raise_if_exited(server: Server, when: str) -> None:
    """Raises the ServerError of a started server that was stopped or whose process (its guard, which exits as the
    server did) ended; says when its log says the port was taken."""
    if server.stopped:
        raise ServerError(f"{server.name} at {server.url} was stopped")
    if server.process is None or (code := server.process.poll()) is None:
        return
    ended = guard.describe(code) + when
    spec = server.spec
    if spec is not None and ADDRESS_IN_USE in log_end(spec.log_path).lower():
        ended += (f": its log says {ADDRESS_IN_USE!r}, a port it needs is taken (port {spec.port} on {spec.host}? "
                  f"set {PORT_SETTING} to a free port)")
    raise failure(server, ended)


def failure(server: Server, what: str) -> ServerError:
    """`<name> at <url> <what>; its log: <path>`, then the log's last lines, indented."""
    line = f"{server.name} at {server.url} {what}"
    if server.log_path is None:
        return ServerError(line)
    tail = [text for text in log_end(server.log_path).splitlines() if text.strip()][-LOG_TAIL_LINES:]
    return ServerError("\n".join([f"{line}; its log: {server.log_path}", *(f"  | {text}" for text in tail)]))


def log_end(path: Path) -> str:
    """The last LOG_END_BYTES of a server's log ("" when it cannot be read)."""
    try:
        with path.open("rb") as log:
            log.seek(max(0, log.seek(0, os.SEEK_END) - LOG_END_BYTES))
            return log.read().decode(errors="replace")
    except OSError:
        return ""


def stop(*servers: Server) -> None:
    """Stops the servers tokenpo started (a given one is left alone) and returns once their process trees are gone:
    each guard sends SIGTERM to its tree and SIGKILL after the spec's grace; a tree still there GUARD_SLACK_S
    later, or whose guard was killed, gets SIGKILL from here. Stopping a stopped server does nothing."""
    running = [server for server in servers if server.process is not None and not server.stopped]
    for server in running:
        server.stopped = True
        if server.process.poll() is None:
            server.process.send_signal(signal.SIGTERM)  # the guard stops its group
        elif server.process.returncode < 0:
            signal_group(server.process.pid, signal.SIGTERM)  # what a killed guard left
    deadline = time.monotonic() + max((server.spec.grace_s for server in running), default=0.0) + GUARD_SLACK_S
    for server in running:
        if not tree_ends(server.process, deadline):
            signal_group(server.process.pid, signal.SIGKILL)
            tree_ends(server.process, time.monotonic() + KILL_WAIT_S)


def signal_group(group: int, signum: int) -> None:
    try:
        os.killpg(group, signum)
    except ProcessLookupError:  # the group is gone
        pass


def tree_ends(process: subprocess.Popen[bytes], deadline: float) -> bool:
    """Whether the guard `process` and its tree are gone by `deadline` (time.monotonic)."""
    while not tree_gone(process):
        if time.monotonic() >= deadline:
            return False
        time.sleep(STOP_POLL_S)
    return True


def tree_gone(process: subprocess.Popen[bytes]) -> bool:
    """A guard that exits by itself does so once its children are gone; one that was killed may leave its process
    group (its pid) behind. The group is looked at only then: once empty, its number is free for another process
    (pid_max may be as low as 32768), which must never be signalled."""
    code = process.poll()
    return code is not None and (code >= 0 or not group_exists(process.pid))


def group_exists(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, as someone else's
        return True
    return True


@atexit.register
def stop_started() -> None:
    """At the trainer's exit: stop the servers this process started, and wait for them."""
    stop(*STARTED.get(os.getpid(), []))

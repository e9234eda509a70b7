"""The lifecycle of started and given servers (tokenpo.rollout.server.process), on real processes: a stand-in
server (standin_server.py) that answers GET /health and forks a grandchild as vLLM's API server spawns its engine
core, and a stand-in trainer (standin_trainer.py) that is SIGKILLed or fails. A process counts as gone when /proc
has no running process of its pid (a zombie has ended: it waits only to be reaped)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tokenpo.rollout.server import guard
from tokenpo.rollout.server.process import (
    STARTED, ServerError, ServerSpec, check, given, start, stop, wait_ready)

HERE = Path(__file__).parent
REPO = HERE.parents[2]
STANDIN_SERVER = HERE / "standin_server.py"
STANDIN_TRAINER = HERE / "standin_trainer.py"
# generous: the test machine is shared and loaded; the polls are short, so a pass is as quick as the processes
READY_S = 60.0
GONE_S = 20.0

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="servers are started on Linux only (prctl)")


@pytest.fixture(autouse=True)
def stop_what_the_test_started():
    yield
    stop(*STARTED.get(os.getpid(), []))


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def standin(tmp_path: Path, *flags: str, port: int | None = None, grace_s: float = 1.0) -> ServerSpec:
    port = port or free_port()
    command = (sys.executable, str(STANDIN_SERVER), "--port", str(port), "--pids", str(tmp_path / "pids"), *flags)
    return ServerSpec("stand-in server", command, "127.0.0.1", port, tmp_path / "logs" / "server.log",
                      grace_s=grace_s)


def tree(server, tmp_path: Path) -> list[int]:
    """The guard's, the stand-in server's and its grandchild's pids."""
    server_pid, grandchild = map(int, (tmp_path / "pids").read_text().split())
    return [server.process.pid, server_pid, grandchild]


def running(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def still_running(pids: list[int], within_s: float = GONE_S) -> list[int]:
    """The pids still running after `within_s` seconds at most ([] as soon as all are gone)."""
    deadline = time.monotonic() + within_s
    while (alive := [pid for pid in pids if running(pid)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return alive


def first_line(error: pytest.ExceptionInfo) -> str:
    return str(error.value).splitlines()[0]


def test_a_started_server_is_ready_healthy_and_stopped_with_its_whole_tree(tmp_path):
    spec = standin(tmp_path, "--grandchild")
    server = start(spec)
    wait_ready(server, READY_S)
    check(server)
    pids = tree(server, tmp_path)
    assert all(map(running, pids)) and pids[2] != 0
    assert [os.getpgid(pid) for pid in pids] == [server.process.pid] * 3  # one group, led by the guard
    assert server.url == f"http://127.0.0.1:{spec.port}"
    stop(server)
    assert [pid for pid in pids if running(pid)] == []  # gone when stop returns
    stop(server)  # again: nothing to do
    with pytest.raises(ServerError, match=r"^stand-in server at http://127\.0\.0\.1:\d+ was stopped$"):
        check(server)
    assert f"started {sys.executable} {STANDIN_SERVER}" in spec.log_path.read_text()


@pytest.mark.parametrize("flags", [(), ("--grandchild-group",)], ids=["one-group", "grandchild-in-a-group-of-its-own"])
def test_stop_kills_a_tree_that_ignores_sigterm_after_the_grace(tmp_path, flags):
    server = start(standin(tmp_path, "--grandchild", "--ignore-term", *flags, grace_s=1.0))
    wait_ready(server, READY_S)
    pids = tree(server, tmp_path)
    assert (os.getpgid(pids[2]) == pids[2]) == bool(flags)
    began = time.monotonic()
    stop(server)
    assert [pid for pid in pids if running(pid)] == []
    assert 1.0 <= time.monotonic() - began < 1.0 + 5.0  # the guard's grace, not stop's own SIGKILL after the slack
    assert "still running 1 s after SIGTERM: SIGKILL to the tree" in server.log_path.read_text()


def test_a_taken_port_is_one_line_before_anything_starts(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        spec = standin(tmp_path, port=port)
        with pytest.raises(ServerError) as error:
            start(spec)
    assert str(error.value) == (f"stand-in server: port {port} on 127.0.0.1 is taken (another process listens "
                                f"there); set rollout.server.port to a free port")
    assert not spec.log_path.exists() and not (tmp_path / "pids").exists()


def test_a_missing_command_is_one_line_before_anything_starts(tmp_path):
    spec = ServerSpec("stand-in server", ("no-such-server-command",), "127.0.0.1", free_port(), tmp_path / "log")
    with pytest.raises(ServerError, match="^stand-in server: command not found: no-such-server-command$"):
        start(spec)


def test_a_server_that_dies_during_startup_is_reported_at_once_with_its_log_tail(tmp_path):
    spec = standin(tmp_path, "--grandchild", "--fail", "3")
    server = start(spec)
    began = time.monotonic()
    with pytest.raises(ServerError) as error:
        wait_ready(server, READY_S)
    assert time.monotonic() - began < 15.0  # at once, not after READY_S
    assert first_line(error) == (f"stand-in server at {spec.url} exited with code 3 during startup; its log: "
                                 f"{spec.log_path}")
    assert "  | stand-in: failing on purpose" in str(error.value).splitlines()[1:]
    grandchild = tree(server, tmp_path)[2]
    assert still_running([grandchild], 0) == []  # the guard stopped what the server left before it exited


def test_a_port_taken_after_the_check_is_named_from_the_servers_log(tmp_path):
    spec = standin(tmp_path, "--bind-delay", "1")
    server = start(spec)
    with socket.socket() as taken:  # taken between start's check and the server's bind
        taken.bind(("127.0.0.1", spec.port))
        taken.listen()
        with pytest.raises(ServerError) as error:
            wait_ready(server, READY_S)
    assert first_line(error) == (f"stand-in server at {spec.url} exited with code 1 during startup: its log says "
                                 f"'address already in use', a port it needs is taken (port {spec.port} on "
                                 f"127.0.0.1? set rollout.server.port to a free port); its log: {spec.log_path}")


def test_a_server_not_ready_in_time_is_one_line_naming_the_seconds(tmp_path):
    spec = standin(tmp_path, "--unhealthy")
    server = start(spec)
    with pytest.raises(ServerError) as error:
        wait_ready(server, 1.5)
    assert first_line(error).startswith(f"stand-in server at {spec.url} is not ready after 1.5 s (GET /health: ")
    assert first_line(error).endswith(f"; its log: {spec.log_path}")
    assert server.process.poll() is None  # a timeout says so; stopping is the caller's choice


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM], ids=lambda signum: signum.name)
def test_check_reports_a_killed_server_and_its_leftovers_are_stopped(tmp_path, signum):
    spec = standin(tmp_path, "--grandchild")
    server = start(spec)
    wait_ready(server, READY_S)
    guard_pid, server_pid, grandchild = tree(server, tmp_path)
    os.kill(server_pid, signum)  # the OOM killer, say
    assert server.process.wait(timeout=GONE_S) == -signum  # the guard ends as its server did
    with pytest.raises(ServerError) as error:
        check(server)
    assert first_line(error) == f"stand-in server at {spec.url} was killed by {signum.name}; its log: {spec.log_path}"
    assert f"the server (pid {server_pid}) was killed by {signum.name}; stopping what it left" in str(error.value)
    assert still_running([grandchild], 0) == []


def test_a_leftover_of_a_dead_server_that_ignores_sigterm_is_killed_after_the_grace(tmp_path):
    server = start(standin(tmp_path, "--grandchild", "--ignore-term", grace_s=1.0))
    wait_ready(server, READY_S)
    guard_pid, server_pid, grandchild = tree(server, tmp_path)
    os.kill(server_pid, signal.SIGKILL)
    # the guard, a subreaper, has the orphaned grandchild as its child: it waits for it, then kills the group
    assert server.process.wait(timeout=GONE_S) == -signal.SIGKILL
    assert still_running([grandchild], 0) == []
    assert "still running 1 s after SIGTERM: SIGKILL to the tree" in server.log_path.read_text()


def test_a_killed_guard_takes_its_server_along_and_stop_ends_the_rest(tmp_path):
    server = start(standin(tmp_path, "--grandchild"))
    wait_ready(server, READY_S)
    guard_pid, server_pid, grandchild = tree(server, tmp_path)
    os.kill(guard_pid, signal.SIGKILL)  # the guard itself killed (the OOM killer)
    assert still_running([server_pid]) == []  # the server's own parent-death signal
    assert running(grandchild)  # orphaned, still in the group
    with pytest.raises(ServerError, match=r"^stand-in server at \S+ was killed by SIGKILL; its log: "):
        check(server)
    began = time.monotonic()
    stop(server)  # SIGTERM to the group, from here
    assert [pid for pid in (server_pid, grandchild) if running(pid)] == []
    assert time.monotonic() - began < 5.0  # not the SIGKILL after the grace and the slack (1 + 5 s)


def test_check_reports_a_server_that_stops_answering_within_its_timeout(tmp_path):
    spec = standin(tmp_path, "--grandchild")
    server = start(spec)
    wait_ready(server, READY_S)
    pids = tree(server, tmp_path)
    os.kill(pids[1], signal.SIGSTOP)  # alive, listening, answering nothing
    began = time.monotonic()
    with pytest.raises(ServerError) as error:
        check(server, timeout_s=1.0)
    assert time.monotonic() - began < 10.0
    assert first_line(error) == (f"stand-in server at {spec.url} is not healthy (GET /health: no answer within 1 s); "
                                 f"its log: {spec.log_path}")
    stop(server)  # a stopped process ignores SIGTERM until it continues: the grace's SIGKILL ends it
    assert [pid for pid in pids if running(pid)] == []


def test_a_given_server_is_checked_and_never_stopped(tmp_path):
    port = free_port()
    process = subprocess.Popen([sys.executable, str(STANDIN_SERVER), "--port", str(port), "--pids",
                                str(tmp_path / "pids")])
    try:
        server = given(f"http://127.0.0.1:{port}/", "remote server")
        wait_ready(server, READY_S)
        check(server)
        stop(server)
        assert process.poll() is None
    finally:
        process.kill()
        process.wait()
    with pytest.raises(ServerError) as error:
        check(server)
    assert str(error.value) == (f"remote server at http://127.0.0.1:{port} is not healthy (GET /health: Connection "
                                f"refused)")


def test_a_given_url_must_be_http():
    with pytest.raises(ServerError, match="^remote server: 'localhost:8000' is not the http\\(s\\) URL of a server$"):
        given("localhost:8000", "remote server")


@pytest.mark.parametrize("host, url", [("0.0.0.0", "http://127.0.0.1:8000"), ("::", "http://[::1]:8000"),
                                       ("10.0.0.5", "http://10.0.0.5:8000"), ("fe80::1", "http://[fe80::1]:8000")])
def test_the_url_reaches_a_server_listening_on_every_address_on_the_loopback(tmp_path, host, url):
    assert ServerSpec("s", ("vllm",), host, 8000, tmp_path / "log").url == url


def test_servers_start_from_the_main_thread_only(tmp_path):
    failures = []
    thread = threading.Thread(target=lambda: failures.append(pytest.raises(RuntimeError, start, standin(tmp_path))))
    thread.start()
    thread.join()
    assert "start servers from the main thread" in str(failures[0].value)


def run_trainer(tmp_path: Path, then: str, *server_flags: str) -> tuple[subprocess.Popen, list[int]]:
    """The stand-in trainer, once its server is ready, and the pids of the server's tree."""
    guard_pid = tmp_path / "guard_pid"
    trainer = subprocess.Popen([sys.executable, str(STANDIN_TRAINER), "--port", str(free_port()), "--log",
                                str(tmp_path / "server.log"), "--pids", str(tmp_path / "pids"), "--guard-pid",
                                str(guard_pid), "--then", then, "--", *server_flags],
                               env={**os.environ, "PYTHONPATH": str(REPO)}, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + READY_S
    while not guard_pid.exists() and trainer.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert guard_pid.exists(), trainer.stderr.read() if trainer.poll() is not None else "not ready"
    server_pid, grandchild = map(int, (tmp_path / "pids").read_text().split())
    return trainer, [int(guard_pid.read_text()), server_pid, grandchild]


def kill_group(pids: list[int]) -> None:
    """After a failed test: what is left of a stand-in trainer's server tree (the guard's group, the grandchild)."""
    for group in {pids[0], os.getpgid(pids[2]) if running(pids[2]) else pids[0]}:
        try:
            os.killpg(group, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.mark.parametrize("server_flags", [(), ("--ignore-term",), ("--ignore-term", "--grandchild-group")],
                         ids=["exits-on-sigterm", "ignores-sigterm", "grandchild-in-a-group-of-its-own"])
def test_the_whole_tree_dies_with_a_sigkilled_trainer(tmp_path, server_flags):
    trainer, pids = run_trainer(tmp_path, "sleep", *server_flags)
    try:
        assert all(map(running, pids))
        trainer.kill()  # SIGKILL: the trainer runs no handler, no atexit
        trainer.wait()
        assert still_running(pids) == []  # the guard's SIGTERM, then SIGKILL after its 1 s grace
    finally:
        kill_group(pids)
    log = (tmp_path / "server.log").read_text()
    assert "got SIGTERM (the trainer stopped the server or died): stopping its tree" in log


def test_a_trainer_that_fails_stops_its_servers_before_it_exits(tmp_path):
    # the server takes 1 s to exit on SIGTERM: the guard alone (told by the trainer's death) would leave it running
    # after the trainer's end; the trainer's exit hook waits for it
    trainer, pids = run_trainer(tmp_path, "raise", "--term-delay", "1")
    try:
        assert trainer.wait(timeout=READY_S) == 1
        assert [pid for pid in pids if running(pid)] == []
    finally:
        kill_group(pids)
    assert "RuntimeError: the stand-in trainer fails" in trainer.stderr.read()


def test_a_guard_whose_trainer_is_gone_starts_nothing(tmp_path):
    marker = tmp_path / "ran"
    not_the_parent = os.getpid() + 1_000_000
    done = subprocess.run(guard.command(not_the_parent, 1.0, [sys.executable, "-c", f"open({str(marker)!r}, 'w')"]),
                          capture_output=True, text=True, timeout=READY_S)
    assert done.returncode == 1 and not marker.exists()
    assert f"the trainer (pid {not_the_parent}) is gone; not starting {sys.executable}" in done.stderr

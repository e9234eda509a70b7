"""A stand-in trainer for the server lifecycle tests: starts the stand-in server (standin_server.py, with a
grandchild) through tokenpo.rollout.server.process, waits until it is ready, writes its guard's pid to --guard-pid,
then sleeps (for the test to SIGKILL it) or raises (its exit stops the server). Arguments after `--` go to the
server."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from tokenpo.rollout.server.process import ServerSpec, start, wait_ready

STANDIN_SERVER = Path(__file__).with_name("standin_server.py")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--log", type=Path, required=True)
    parser.add_argument("--pids", required=True)
    parser.add_argument("--guard-pid", type=Path, required=True)
    parser.add_argument("--then", choices=["sleep", "raise"], required=True)
    parser.add_argument("server_args", nargs="*")
    args = parser.parse_args()
    command = (sys.executable, str(STANDIN_SERVER), "--port", str(args.port), "--pids", args.pids, "--grandchild",
               *args.server_args)
    server = start(ServerSpec("stand-in server", command, "127.0.0.1", args.port, args.log, grace_s=1.0))
    wait_ready(server, 60)
    # written whole before the test can see it (the test reads the file as soon as it exists)
    partial = args.guard_pid.with_suffix(".partial")
    partial.write_text(f"{server.process.pid}\n")
    partial.rename(args.guard_pid)
    if args.then == "sleep":
        time.sleep(600)
    raise RuntimeError("the stand-in trainer fails")


if __name__ == "__main__":
    main()

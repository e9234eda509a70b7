"""A stand-in for `vllm serve` in the server lifecycle tests: answers GET /health on --host:--port; with
--grandchild it first forks a process that sleeps, as vLLM's API server spawns its engine core. Writes
"<its pid> <grandchild pid or 0>" to --pids before it listens."""

from __future__ import annotations

import argparse
import http.server
import os
import signal
import sys
import time


class Health(http.server.BaseHTTPRequestHandler):
    status = 200

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        self.send_response(self.status if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--pids", required=True)
    parser.add_argument("--grandchild", action="store_true")
    parser.add_argument("--grandchild-group", action="store_true",
                        help="the grandchild starts a process group of its own, as vLLM's data-parallel API servers")
    parser.add_argument("--ignore-term", action="store_true", help="it and its grandchild ignore SIGTERM")
    parser.add_argument("--term-delay", type=float, default=0.0, help="seconds it takes to exit on SIGTERM")
    parser.add_argument("--fail", type=int, help="print a line and exit with this code before listening")
    parser.add_argument("--bind-delay", type=float, default=0.0, help="seconds before it binds the port")
    parser.add_argument("--unhealthy", action="store_true", help="/health answers 503")
    args = parser.parse_args()
    if args.ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    elif args.term_delay:
        signal.signal(signal.SIGTERM, lambda *_: (time.sleep(args.term_delay), os._exit(0)))
    grandchild = os.fork() if args.grandchild else 0
    if args.grandchild and grandchild == 0:
        if args.grandchild_group:
            os.setpgrp()
        time.sleep(3600)
        os._exit(0)
    if args.grandchild_group:
        os.setpgid(grandchild, grandchild)  # here too, as shells do: done before the pids are written
    with open(args.pids, "w") as out:
        out.write(f"{os.getpid()} {grandchild}\n")
    if args.fail is not None:
        print("stand-in: failing on purpose", flush=True)
        sys.exit(args.fail)
    time.sleep(args.bind_delay)
    Health.status = 503 if args.unhealthy else 200
    http.server.HTTPServer((args.host, args.port), Health).serve_forever()


if __name__ == "__main__":
    main()

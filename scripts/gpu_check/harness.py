"""The GPU check's runner: each part is a subprocess with its own timeout inside one wall-clock budget, and the
output folder holds, as each part finishes, its log (<part>.log, written as it runs), its row (<part>.json) and the
table of every part so far (gpu_check.md, rewritten after each part), so a run killed at any point still returns
what it did."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

# a part needs this much of the budget to start at all: below it, the start-up alone would eat the time
MIN_START_S = 10.0
# seconds a timed-out part gets between SIGTERM and SIGKILL (torchrun's default grace is 30 s; a short slot has less)
KILL_GRACE_S = 5.0


@dataclass(frozen=True)
class Part:
    """One check: argv is run with the result path appended (`--result <out>/<name>.result.json`); the part writes its
    findings there as {"ok": bool, "summary": str, ...}."""

    name: str
    what: str
    argv: list[str]
    timeout_s: float


@dataclass
class Row:
    """A part's outcome. status: ok | failed | timeout | killed (the harness was stopped while it ran) | not run."""

    part: str
    what: str
    status: str = "not run"
    seconds: float | None = None
    summary: str = ""
    findings: dict = field(default_factory=dict)


def markdown_cell(text: str) -> str:
    """`text` as one table cell: no newline or bar breaks the row."""
    return " ".join(str(text).split()).replace("|", "\\|")


def render_table(header: str, rows: list[Row]) -> str:
    lines = [header.rstrip() + "\n", "| part | what | result | seconds | findings |", "|---|---|---|---:|---|"]
    for row in rows:
        seconds = "" if row.seconds is None else f"{row.seconds:.0f}"
        lines.append(f"| {row.part} | {markdown_cell(row.what)} | {row.status} | {seconds} | "
                     f"{markdown_cell(row.summary)} |")
    return "\n".join(lines) + "\n"


def write_atomic(path: Path, text: str) -> None:
    """A reader (or a kill) never sees half a file: the text goes to a sibling first, then replaces `path`."""
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text)
    os.replace(partial, path)


def last_line(log: Path) -> str:
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()] if log.exists() else []
    errors = [line for line in lines if "error" in line.lower()]
    return ((errors or lines or ["no output"])[-1])[:300]


def stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM to the part's whole process group (a part's own subprocesses too), SIGKILL after the grace."""
    for sig, wait_s in ((signal.SIGTERM, KILL_GRACE_S), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def finished_row(row: Row, result_path: Path, log: Path, returncode: int) -> Row:
    """The row of a part that exited: its own findings when it wrote them, else the last error line of its log."""
    findings = json.loads(result_path.read_text()) if result_path.exists() else {}
    row.findings = findings
    if returncode == 0 and findings.get("ok"):
        row.status, row.summary = "ok", findings.get("summary", "")
    else:
        row.status = "failed"
        row.summary = findings.get("summary") or f"exit {returncode}: {last_line(log)}"
    return row


class Stopped(Exception):
    """The harness got SIGTERM/SIGINT (the slot's limit): the running part is stopped and recorded as killed (row)."""

    row: Row | None = None


def raise_stopped(signum, frame) -> None:
    raise Stopped(signal.Signals(signum).name)


def run_part(part: Part, out: Path, timeout_s: float, cwd: Path) -> Row:
    row = Row(part.name, part.what)
    log, result_path = out / f"{part.name}.log", out / f"{part.name}.result.json"
    result_path.unlink(missing_ok=True)
    start = time.monotonic()
    with log.open("w") as stream:
        # its own session: a timeout stops the part's children (tokenpo.train, reward workers) with it
        proc = subprocess.Popen([*part.argv, "--result", str(result_path)], cwd=cwd, stdout=stream,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            returncode = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            stop_group(proc)
            row.status, row.summary = "timeout", f"timed out after {timeout_s:.0f} s: {last_line(log)}"
        except Stopped as why:
            stop_group(proc)
            row.status, row.summary = "killed", f"the check was stopped ({why}) while this part ran"
            row.seconds = time.monotonic() - start
            why.row = row
            raise
        else:
            finished_row(row, result_path, log, returncode)
    row.seconds = time.monotonic() - start
    return row


def run_check(parts: list[Part], out: Path, budget_s: float, header: str, cwd: Path) -> list[Row]:
    """Runs `parts` in order; each gets min(its timeout, what is left of `budget_s`). Returns the rows."""
    out.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + budget_s
    rows = [Row(part.name, part.what) for part in parts]
    table = out / "gpu_check.md"
    write_atomic(table, render_table(header, rows))
    previous = {sig: signal.signal(sig, raise_stopped) for sig in (signal.SIGTERM, signal.SIGINT)}
    index = 0
    try:
        for index, part in enumerate(parts):
            # a timed-out part still gets its grace before SIGKILL: that too comes out of the budget
            left = deadline - time.monotonic() - KILL_GRACE_S
            if left < MIN_START_S:
                rows[index].summary = f"not started: {max(left, 0):.0f} s of the {budget_s:.0f} s budget left"
            else:
                print(f"gpu_check: {part.name} (up to {min(part.timeout_s, left):.0f} s)", flush=True)
                rows[index] = run_part(part, out, min(part.timeout_s, left), cwd)
                print(f"gpu_check: {part.name}: {rows[index].status} {rows[index].summary}", flush=True)
            write_atomic(out / f"{part.name}.json", json.dumps(asdict(rows[index]), indent=1))
            write_atomic(table, render_table(header, rows))
    except Stopped as why:
        if why.row is not None:
            rows[index] = why.row
            write_atomic(out / f"{parts[index].name}.json", json.dumps(asdict(why.row), indent=1))
        for row in rows:
            if row.status == "not run" and not row.summary:
                row.summary = f"not started: the check was stopped ({why})"
        write_atomic(table, render_table(header, rows))
        raise SystemExit(143) from None
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return rows


def python_part(name: str, what: str, timeout_s: float, module: Path, *args: str) -> Part:
    """A part that runs `module` (a script of this folder) with this Python."""
    return Part(name, what, [sys.executable, str(module), *args], timeout_s)

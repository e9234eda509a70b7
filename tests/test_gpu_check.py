"""The GPU check's harness (scripts/gpu_check/harness.py): a part past its timeout gets a "timeout" row and the next
part still runs; a harness stopped mid-run (SIGTERM, or SIGKILL with no chance to clean up) leaves the finished
parts' rows and logs in its output folder; the table is valid markdown with one row per part. The parts here are
stand-ins (small Python commands); the real parts' CPU rehearsal is `python scripts/gpu_check.py --device cpu`."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts" / "gpu_check"))

import harness  # noqa: E402
import parts  # noqa: E402

# a stand-in part: sys.argv[-1] is the result path the harness appends
WRITES_OK = ("import json, sys; print('part log line', flush=True); "
             "json.dump({'ok': True, 'summary': 'did its work'}, open(sys.argv[-1], 'w'))")
SLEEPS = "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(120)"
FAILS = "import sys; print('tokenpo: error: trainer.lr must be > 0, got -1', file=sys.stderr); sys.exit(2)"


def part(name: str, code: str, timeout_s: float = 30, *args: str) -> harness.Part:
    return harness.Part(name, f"stand-in {name}", [sys.executable, "-c", code, *args], timeout_s)


def table_rows(text: str) -> list[list[str]]:
    """The cells of each body row of the one markdown table in `text` (checks it is one well-formed table)."""
    lines = [line for line in text.splitlines() if line.startswith("|")]
    head, rule, *body = lines
    width = len(re.split(r"(?<!\\)\|", head)) - 2
    assert rule == "|" + "|".join(["---", "---", "---", "---:", "---"]) + "|"
    rows = [[cell.strip() for cell in re.split(r"(?<!\\)\|", line)[1:-1]] for line in body]
    assert all(len(row) == width == 5 for row in rows)
    return rows


def test_a_part_past_its_timeout_gets_a_timeout_row_and_the_next_part_runs(tmp_path):
    pid_file = tmp_path / "sleeper.pid"
    plan = [part("first", WRITES_OK), part("slow", SLEEPS, 1, str(pid_file)), part("broken", FAILS),
            part("last", WRITES_OK)]
    start = time.monotonic()
    rows = harness.run_check(plan, tmp_path / "out", 60, "# check\n", tmp_path)
    assert time.monotonic() - start < 15
    assert [row.status for row in rows] == ["ok", "timeout", "failed", "ok"]
    assert rows[1].summary.startswith("timed out after 1 s") and rows[1].seconds < 8
    assert rows[2].summary == "exit 2: tokenpo: error: trainer.lr must be > 0, got -1"
    # the timed-out part's process is gone, not left running
    with pytest.raises(ProcessLookupError):
        os.kill(int(pid_file.read_text()), 0)
    out = tmp_path / "out"
    assert [cells[0] for cells in table_rows((out / "gpu_check.md").read_text())] == ["first", "slow", "broken", "last"]
    assert [cells[2] for cells in table_rows((out / "gpu_check.md").read_text())] == ["ok", "timeout", "failed", "ok"]
    assert json.loads((out / "slow.json").read_text())["status"] == "timeout"
    assert (out / "first.log").read_text() == "part log line\n"


def test_a_part_gets_only_what_is_left_of_the_budget(tmp_path, monkeypatch):
    monkeypatch.setattr(harness, "MIN_START_S", 1.0)
    plan = [part("slow", SLEEPS, 100, str(tmp_path / "pid")), part("next", WRITES_OK)]
    rows = harness.run_check(plan, tmp_path / "out", harness.KILL_GRACE_S + 2, "# check\n", tmp_path)
    # its grace before SIGKILL comes out of the budget too
    assert rows[0].status == "timeout" and rows[0].summary.startswith("timed out after 2 s")
    assert rows[1].status == "not run" and rows[1].summary.startswith("not started: 0 s of the 7 s budget left")


DRIVER = """import sys
sys.path.insert(0, sys.argv[1])
import harness
ok = "import json, sys; json.dump({'ok': True, 'summary': 'done'}, open(sys.argv[-1], 'w'))"
sleep = "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(120)"
plan = [harness.Part("first", "quick", [sys.executable, "-c", ok], 30),
        harness.Part("second", "hangs", [sys.executable, "-c", sleep, sys.argv[3]], 100),
        harness.Part("third", "quick", [sys.executable, "-c", ok], 30)]
harness.run_check(plan, __import__("pathlib").Path(sys.argv[2]), 300, "# check\\n", __import__("pathlib").Path("."))
"""


def started_driver(tmp_path: Path) -> tuple[subprocess.Popen, Path, Path]:
    out, pid_file = tmp_path / "out", tmp_path / "second.pid"
    proc = subprocess.Popen([sys.executable, "-c", DRIVER, str(REPO / "scripts" / "gpu_check"), str(out),
                             str(pid_file)], cwd=tmp_path)
    deadline = time.monotonic() + 30
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < deadline and proc.poll() is None, "the second part never started"
        time.sleep(0.05)
    return proc, out, pid_file


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_stopped_check_keeps_the_finished_parts_rows_and_logs(tmp_path, sig):
    proc, out, pid_file = started_driver(tmp_path)
    sleeper = int(pid_file.read_text())
    try:
        proc.send_signal(sig)
        proc.wait(timeout=20)
        rows = table_rows((out / "gpu_check.md").read_text())
        assert [cells[0] for cells in rows] == ["first", "second", "third"]
        assert rows[0][2] == "ok" and json.loads((out / "first.json").read_text())["status"] == "ok"
        assert (out / "first.log").exists() and (out / "second.log").exists()
        if sig == signal.SIGTERM:
            # the harness stopped the running part's process group and said so
            assert proc.returncode == 143
            assert [cells[2] for cells in rows] == ["ok", "killed", "not run"]
            assert rows[2][4] == "not started: the check was stopped (SIGTERM)"
            with pytest.raises(ProcessLookupError):
                os.kill(sleeper, 0)
        else:
            # no chance to write anything more: the table as it was when the second part started
            assert [cells[2] for cells in rows] == ["ok", "not run", "not run"]
    finally:
        try:
            os.kill(sleeper, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_the_table_escapes_what_would_break_a_row():
    rows = [harness.Row("a", "x | y", "failed", 1.0, "line one\nline | two")]
    text = harness.render_table("# t\n", rows)
    assert table_rows(text) == [["a", "x \\| y", "failed", "1", "line one line \\| two"]]


def test_the_parts_timeouts_fit_the_command_budget():
    spec = importlib.util.spec_from_file_location("gpu_check_entry", REPO / "scripts" / "gpu_check.py")
    entry = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(entry)
    total_s = int(re.search(r"GPU_CHECK_TOTAL_S:-(\d+)", (REPO / "scripts" / "check_gpu.sh").read_text()).group(1))
    # the one command stays under 8 minutes; the parts' timeouts leave 30 s of it to the install (a slower install
    # shortens the last parts: they get what is left of the budget)
    assert total_s < 480 and sum(timeout_s for _, _, timeout_s in entry.PLAN) <= total_s - 30
    assert [name for name, _, _ in entry.PLAN] == list(parts.PARTS)


def test_each_empty_cache_call_is_recorded_with_its_tokenpo_caller_and_reserved_bytes(tmp_path, monkeypatch):
    """record_phases.py on a stand-in CUDA: reserved memory 5 GiB before the call, 1 GiB after."""
    import torch

    record = tmp_path / "phases.jsonl"
    monkeypatch.setenv("GPU_CHECK_PHASES", str(record))
    freed = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: freed.append(True))
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda: 1 * 2**30 if freed else 5 * 2**30)
    spec = importlib.util.spec_from_file_location("record_phases", REPO / "scripts" / "gpu_check" / "record_phases.py")
    spec.loader.exec_module(importlib.util.module_from_spec(spec))
    # a function of a tokenpo module that frees the cache between two phases
    namespace = {"__name__": "tokenpo.trainer.stand_in", "torch": torch}
    exec("def after_update():\n    torch.cuda.empty_cache()\n", namespace)
    namespace["after_update"]()
    (event,) = [json.loads(line) for line in record.read_text().splitlines()]
    assert freed == [True]
    assert event["caller"] == "trainer.stand_in.after_update" and event["stack"] == ["trainer.stand_in.after_update"]
    assert (event["reserved_before"], event["reserved_after"]) == (5 * 2**30, 2**30)


@pytest.mark.slow  # 17 s: draws and saves the 152064 x 64 embedding
def test_the_152k_vocabulary_model_is_qwen2_5s_output_rows_at_the_cpu_sizes(tmp_path):
    from transformers import AutoConfig

    folder = parts.vocab152k(tmp_path, parts.CPU)
    config = AutoConfig.from_pretrained(folder)
    assert (config.vocab_size, config.num_hidden_layers, config.hidden_size) == (152064, 2, 64)
    assert len(config.layer_types) == 2 and (folder / "tokenizer.json").is_file()
    assert parts.vocab152k(tmp_path, parts.CPU) == folder  # drawn once, then reused


@pytest.mark.e2e  # about 3.5 minutes on 2 cores: every part's tokenpo runs at the CPU sizes
def test_the_cpu_rehearsal_runs_every_part(tmp_path):
    """Every part of the GPU check, in order, at its CPU sizes (gloo, fp32, models 64 wide): a part whose code no
    longer fits tokenpo (a renamed keyword, a removed key) fails here, not on the first GPU slot."""
    done = subprocess.run([sys.executable, REPO / "scripts" / "gpu_check.py", "--device", "cpu", "--out",
                           tmp_path / "out", "--work", tmp_path / "work", "--budget", "1500"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=1600)
    rows = table_rows((tmp_path / "out" / "gpu_check.md").read_text())
    assert [(cells[0], cells[2]) for cells in rows] == [(name, "ok") for name in parts.PARTS], (
        done.stdout[-3000:] + done.stderr[-3000:])
    assert done.returncode == 0
    dtypes = json.loads((tmp_path / "out" / "dtypes.json").read_text())["findings"]
    assert dtypes["figures"]["outcomes"]["bfloat16+bf16"] == "trains"
    assert dtypes["runs"][0]["steps"][0]["kl/ref"] == 0.0
    two_ranks = json.loads((tmp_path / "out" / "zero3_two_ranks.json").read_text())["findings"]
    assert two_ranks["figures"]["apart"] == {} and len(two_ranks["runs"]) == 2
    assert (tmp_path / "out" / "device_tiny.log").stat().st_size > 0

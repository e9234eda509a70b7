"""Committed files under docs/ hold no absolute path of the machine that wrote them (a run dir, a temporary folder,
a home directory), and the user pages hold no development history: commit ids, "this change", session notes
(those belong in docs/records/)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
# an absolute path under a machine's own folders: /work/..., /tmp/..., /root/..., /home/..., /Users/...; not the same
# words inside a URL or a relative path (`outputs/tmp/`)
MACHINE_PATH = re.compile(rb"(?<![\w.~/-])/(?:work|tmp|root|home|Users|scratch|private/var)/")


def committed_files() -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "-z", "docs"], cwd=REPO, capture_output=True, check=True).stdout
    return [REPO / name for name in listed.decode().split("\0") if name and (REPO / name).is_file()]


def machine_paths(data: bytes) -> list[str]:
    return [data[max(0, m.start() - 20):m.end() + 40].decode(errors="replace") for m in MACHINE_PATH.finditer(data)]


def test_the_pattern_finds_machine_paths_and_only_those():
    assert machine_paths(b'"out": "/work/main/docs/x.json"') and machine_paths(b"run dir /tmp/abc/run")
    assert machine_paths(b"`/home/me/data.jsonl`") and machine_paths(b"(/root/.cache)")
    assert not machine_paths(b"https://example.org/home/page outputs/tmp/x ~/work/y data/work/z")


def test_no_committed_file_under_docs_holds_a_machine_path():
    found = {path.relative_to(REPO).as_posix(): hits for path in committed_files()
             if (hits := machine_paths(path.read_bytes()))}
    assert not found, "absolute machine paths (write them relative to the repository):\n" + "\n".join(
        f"{name}: {hits[0]!r} ({len(hits)} in all)" for name, hits in sorted(found.items()))


USER_PAGES = sorted(path for path in DOCS.rglob("*.md") if path.relative_to(DOCS).parts[0] not in ("records", "data"))
# a commit id: 7-12 hexadecimal characters holding a digit and a letter, alone or in backticks
COMMIT_ID = re.compile(r"(?<![\w./-])(?=[0-9a-f]{0,11}[a-f])(?=[0-9a-f]{0,11}[0-9])[0-9a-f]{7,12}(?![\w/-])")
HISTORY = re.compile(r"\bthis (?:change|commit|session)\b|\bsessions?\b that|\bwas lent\b|\bthe tree at\b", re.I)


@pytest.mark.parametrize("page", USER_PAGES, ids=lambda p: p.relative_to(DOCS).as_posix())
def test_user_pages_hold_no_commit_ids_or_session_notes(page):
    text = page.read_text()
    assert not COMMIT_ID.findall(text), f"commit ids (history goes to docs/records/): {COMMIT_ID.findall(text)}"
    assert not HISTORY.findall(text), f"development history (it goes to docs/records/): {HISTORY.findall(text)}"


def test_the_history_patterns_find_what_they_should():
    assert COMMIT_ID.findall("measured on commit `b641cb0` and 6acc456.") == ["b641cb0", "6acc456"]
    assert not COMMIT_ID.findall("a crc32 of deadbeef, 1234567 tokens, abcdefa, sha 0x1f2e3d4c5b")
    assert HISTORY.findall("the tree before this change") and HISTORY.findall("no GPU was lent to the sessions that")


# a command that needs a GPU or a cluster, in a page's code blocks
GPU_COMMAND = re.compile(r"torchrun|sbatch|\bsrun\b|nvidia-smi|--gpus|trainer\.nproc=8|experiment=paper/|model=qwen|"
                         r"hydra/launcher=slurm|check_gpu\.sh|flash_attention_2")
GPU_STATUS = re.compile(r"(?i)not (?:yet )?run on a GPU|nothing in tokenpo has run on a GPU")


def code_blocks(text: str) -> str:
    return "\n".join(re.findall(r"^```[^\n]*\n(.*?)^```", text, flags=re.S | re.M))


@pytest.mark.parametrize("page", USER_PAGES, ids=lambda p: p.relative_to(DOCS).as_posix())
def test_a_page_with_a_gpu_command_says_what_has_run_on_a_gpu(page):
    text = page.read_text()
    if GPU_COMMAND.search(code_blocks(text)):
        assert GPU_STATUS.search(text), "a GPU command without a word on what has (not) run on a GPU (docs/gpu.md)"


def test_the_gpu_command_pattern_reads_code_blocks_only():
    page = "torchrun in prose\n\n```bash\ntokenpo-train trainer.nproc=8\n```\n"
    assert GPU_COMMAND.search(code_blocks(page)) and not GPU_COMMAND.search(code_blocks("torchrun in prose\n"))

"""Build locks of torch extensions left by a killed JIT build are removed at start-up in one line; a lock a live
builder holds is left alone with a line saying that the start waits for it (issue 27 item 4)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tokenpo.deepspeed import build_locks
from tokenpo.deepspeed.build_locks import check_build_locks, extensions_root, lock_files

# what torch.utils.file_baton.FileBaton.try_acquire does, then a builder busy building
HOLD_LOCK = ("import os, sys, time\n"
             "fd = os.open(sys.argv[1], os.O_CREAT | os.O_EXCL)\n"
             "print('building', flush=True)\n"
             "time.sleep(120)\n")


def stale_lock(root: Path, op: str = "deepspeed_shm_comm") -> Path:
    """The lock a build killed midway leaves: a plain file that nothing holds open."""
    (root / op).mkdir(parents=True)
    lock = root / op / "lock"
    os.close(os.open(lock, os.O_CREAT | os.O_EXCL))
    return lock


def test_a_stale_lock_in_a_fresh_extensions_folder_is_removed_in_one_line(tmp_path, caplog):
    lock = stale_lock(tmp_path)
    with caplog.at_level("WARNING"):
        check_build_locks({"TORCH_EXTENSIONS_DIR": str(tmp_path)})
    assert not lock.exists()
    [line] = caplog.messages
    assert line.startswith(f"removed {lock}: the JIT build lock of deepspeed_shm_comm, held by no process (0 s old; ")
    # torch's next build takes the lock at once instead of waiting on it forever
    from torch.utils.file_baton import FileBaton

    baton = FileBaton(str(lock))
    assert baton.try_acquire()
    baton.release()


def test_a_lock_held_by_a_live_builder_is_left_alone_with_a_waiting_line(tmp_path, caplog):
    (tmp_path / "fused_adam").mkdir()
    lock = tmp_path / "fused_adam" / "lock"
    builder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(lock)], stdout=subprocess.PIPE, text=True)
    try:
        assert builder.stdout.readline() == "building\n"
        with caplog.at_level("WARNING"):
            check_build_locks({"TORCH_EXTENSIONS_DIR": str(tmp_path)})
        assert lock.exists()
        [line] = caplog.messages
        assert line.startswith(f"waiting for process {builder.pid}, building the JIT op fused_adam (lock {lock}, ")
    finally:
        builder.kill()
        builder.wait()


def test_on_a_network_filesystem_a_recent_lock_is_named_and_an_old_one_removed(tmp_path, caplog, monkeypatch):
    # a builder on another machine holds such a lock unseen: it is stale only once older than any build takes
    monkeypatch.setattr(build_locks, "on_network_filesystem", lambda path: True)
    lock = stale_lock(tmp_path)
    with caplog.at_level("WARNING"):
        check_build_locks({"TORCH_EXTENSIONS_DIR": str(tmp_path)})
    assert lock.exists()
    assert caplog.messages == [f"waiting on {lock}, the JIT build lock of deepspeed_shm_comm (0 s old, on a network "
                               "filesystem): no process on this machine holds it; if no other machine is building "
                               "deepspeed_shm_comm, remove the file"]
    old = time.time() - build_locks.SHARED_STALE_AFTER_S - 60
    os.utime(lock, (old, old))
    caplog.clear()
    with caplog.at_level("WARNING"):
        check_build_locks({"TORCH_EXTENSIONS_DIR": str(tmp_path)})
    assert not lock.exists() and caplog.messages[0].startswith(f"removed {lock}: ")


def test_only_local_rank_0_removes_a_stale_lock(tmp_path, caplog):
    lock = stale_lock(tmp_path)
    with caplog.at_level("WARNING"):
        check_build_locks({"TORCH_EXTENSIONS_DIR": str(tmp_path), "LOCAL_RANK": "1"})
    assert lock.exists() and caplog.messages == []


def test_a_lock_replaced_after_it_was_judged_stale_is_kept(tmp_path):
    lock = stale_lock(tmp_path)
    seen, judged = lock.stat(), build_locks.build_lock(lock)
    lock.unlink()
    time.sleep(0.01)
    os.close(os.open(lock, os.O_CREAT | os.O_EXCL))  # a new build took the lock meanwhile
    assert not build_locks.remove_if_unchanged(judged, seen)
    assert lock.exists()


def test_the_extensions_root_is_torchs(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "platform", "linux")
    assert extensions_root({"TORCH_EXTENSIONS_DIR": "/x"}) == Path("/x")
    assert extensions_root({"XDG_CACHE_HOME": "/c"}) == Path("/c/torch_extensions")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert extensions_root({}) == tmp_path / ".cache" / "torch_extensions"
    # TORCH_EXTENSIONS_DIR holds <op>/lock, the cache folder <python>_<accelerator>/<op>/lock
    locks = [stale_lock(tmp_path, "a"), stale_lock(tmp_path / "py311_cpu", "deepspeed_shm_comm")]
    assert lock_files(tmp_path) == sorted(locks)


@pytest.mark.skipif(sys.platform != "linux", reason="torch's cache folder is read from XDG_CACHE_HOME on Linux")
def test_the_root_matches_torch_cpp_extension(tmp_path, monkeypatch):
    import torch.utils.cpp_extension as cpp_extension

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
    build_folder = Path(cpp_extension._get_build_directory("some_op", verbose=False))
    assert build_folder.parent.parent == extensions_root(os.environ)

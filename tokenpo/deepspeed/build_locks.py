"""JIT build locks of torch extensions that their builder left behind (issue 27 item 4).

torch.utils.cpp_extension.load, through which DeepSpeed's op builders JIT-build (the CPU comm op on every CPU start,
fused Adam and others on GPUs), guards a build folder with torch.utils.file_baton.FileBaton: a plain file `lock`
created with O_CREAT|O_EXCL, held open by the builder and removed when its build ends. A builder killed in between
(`timeout`, SIGKILL, a preempted or cancelled job) leaves the file, and every later start polls for it to vanish,
forever and without a word. `check_build_locks` runs at start-up, before anything JIT-builds, and says in one line
per lock what it sees:

- a process on this machine holds the lock open: a build is under way; the line says that this process will wait;
- no process holds it and it lies on a local filesystem, or on a network one and is older than any build takes: the
  builder is gone; the lock is removed (torch never clears one) and the line names it;
- no process here holds it but it lies on a network filesystem and is recent: a builder on another machine may hold
  it; the line names the file to remove if none does.

Removing, not refusing: the builder is gone, so the lock guards nothing, and a requeued job would otherwise fail for a
file someone must delete by hand. PyTorch goes the same way: its proposed fix (pytorch/pytorch#149382) asks psutil
whether any process holds the lock open, and its replacement of FileBaton (#190543) takes an flock, which the kernel
releases when the holder dies.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import psutil

log = logging.getLogger("tokenpo")

LOCK_NAME = "lock"
# A lock on a network filesystem may be held by a builder on another machine, whose open files this one cannot
# see: it is taken as stale only once older than any build takes. DeepSpeed's JIT builds take about a minute on the
# CPU (its comm op: 47 s on 2 cores) and minutes for its largest CUDA ops; an hour leaves a wide margin.
SHARED_STALE_AFTER_S = 3600.0
# filesystem types (psutil.disk_partitions) whose files other machines share
NETWORK_FILESYSTEMS = frozenset({"nfs", "nfs4", "cifs", "smb3", "smbfs", "lustre", "gpfs", "beegfs", "ceph",
                                 "glusterfs", "fuse.glusterfs", "fuse.sshfs", "wekafs", "panfs", "afs"})


@dataclass(frozen=True)
class BuildLock:
    """A torch extension's build lock as found at start-up."""
    path: Path
    age_s: float
    # processes on this machine that hold it open (a live builder)
    holders: tuple[int, ...]
    # on a network filesystem: a builder on another machine would hold it unseen
    shared: bool

    @property
    def op(self) -> str:
        return self.path.parent.name

    @property
    def stale(self) -> bool:
        return not self.holders and (not self.shared or self.age_s > SHARED_STALE_AFTER_S)


def extensions_root(env: Mapping[str, str]) -> Path:
    """Where torch.utils.cpp_extension builds: TORCH_EXTENSIONS_DIR, or torch_extensions in the user's cache
    folder (torch._appdirs.user_cache_dir; its <python>_<cpu|cuXXX> subfolders are scanned)."""
    if env.get("TORCH_EXTENSIONS_DIR"):
        return Path(env["TORCH_EXTENSIONS_DIR"])
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Caches" / "torch_extensions"
    return Path(env.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "torch_extensions"


def lock_files(root: Path) -> list[Path]:
    """The build locks under `root`: <op>/lock under TORCH_EXTENSIONS_DIR, <python>_<accelerator>/<op>/lock in the
    cache folder."""
    return sorted([*root.glob(f"*/{LOCK_NAME}"), *root.glob(f"*/*/{LOCK_NAME}")])


def holders(path: Path) -> tuple[int, ...]:
    """The processes on this machine that have `path` open (other users' processes, unreadable, are not seen)."""
    target = os.path.realpath(path)
    found = []
    for process in psutil.process_iter():
        try:
            if any(f.path == target for f in process.open_files()):
                found.append(process.pid)
        except (psutil.Error, OSError):
            continue
    return tuple(found)


def on_network_filesystem(path: Path) -> bool:
    """Whether `path` lies on a filesystem that other machines share (by the type of its mount)."""
    target = os.path.realpath(path)
    mounts = [p for p in psutil.disk_partitions(all=True)
              if target == p.mountpoint or target.startswith(p.mountpoint.rstrip("/") + "/")]
    mount = max(mounts, key=lambda p: len(p.mountpoint), default=None)
    return mount is not None and mount.fstype in NETWORK_FILESYSTEMS


def build_lock(path: Path) -> BuildLock:
    return BuildLock(path, time.time() - path.stat().st_mtime, holders(path), on_network_filesystem(path))


def remove_if_unchanged(lock: BuildLock, seen: os.stat_result) -> bool:
    """Remove the lock file if it is still the one judged stale (not one a new build created since)."""
    try:
        now = lock.path.stat()
        if (now.st_ino, now.st_ctime_ns) != (seen.st_ino, seen.st_ctime_ns) or holders(lock.path):
            return False
        lock.path.unlink()
        return True
    except FileNotFoundError:
        return False


def check_build_locks(env: Mapping[str, str]) -> None:
    """One line for each torch extension build lock under the extensions root, which is removed when its builder is
    gone (see the module's docstring). Only local rank 0 removes, so that the ranks of one machine do not race."""
    remover = env.get("LOCAL_RANK", "0") == "0"
    for path in lock_files(extensions_root(env)):
        try:
            seen = path.stat()
            lock = build_lock(path)
        except FileNotFoundError:  # its build just ended
            continue
        if lock.holders:
            log.warning("waiting for process %s, building the JIT op %s (lock %s, %.0f s old)",
                        ", ".join(map(str, lock.holders)), lock.op, path, lock.age_s)
        elif lock.stale and remover:
            if remove_if_unchanged(lock, seen):
                log.warning("removed %s: the JIT build lock of %s, held by no process (%.0f s old; its build was "
                            "killed midway), on which torch would have waited forever", path, lock.op, lock.age_s)
        elif not lock.stale:
            log.warning("waiting on %s, the JIT build lock of %s (%.0f s old, on a network filesystem): no process "
                        "on this machine holds it; if no other machine is building %s, remove the file",
                        path, lock.op, lock.age_s, lock.op)

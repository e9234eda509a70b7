"""Progress of long work (evaluation, checkpoint hashing, exports, conversions, downloads) with tqdm: a bar with
done/total, rate and time left on a terminal; nothing but the usual log lines when output goes to a file or a pipe
(CI, Slurm logs, `tee`), where the libraries' own bars are turned off too.

`quiet_library_bars()` runs first in each entry point (tokenpo.train, tokenpo.evaluate, a training worker,
tokenpo.bench and its workers).
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import threading
from pathlib import Path
from typing import Iterable, TypeVar

T = TypeVar("T")


def interactive() -> bool:
    """Bars only where someone watches: stderr (where tqdm writes) is a terminal."""
    return sys.stderr.isatty()


def quiet_library_bars() -> None:
    """Off the terminal, every tqdm bar is off: huggingface_hub's (downloads) and transformers' ("Writing model
    shards", "Loading weights") through their own switches, any other (the GGUF conversion's) as TQDM_DISABLE=1 would
    have done had it been set before tqdm was imported; processes started from here inherit TQDM_DISABLE and
    HF_HUB_DISABLE_PROGRESS_BARS."""
    if interactive():
        return
    os.environ.setdefault("TQDM_DISABLE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    import tqdm.std
    from huggingface_hub.utils import disable_progress_bars

    disable_progress_bars()
    if "transformers" in sys.modules:  # imported later, it reads huggingface_hub's switch
        from transformers.utils import logging as transformers_logging

        transformers_logging.disable_progress_bar()
    if not getattr(tqdm.std.tqdm.__init__, "_tokenpo_disabled", False):
        init = functools.partialmethod(tqdm.std.tqdm.__init__, disable=True)
        init._tokenpo_disabled = True
        tqdm.std.tqdm.__init__ = init


def progress(iterable: Iterable[T] | None = None, *, total: float | None = None, desc: str, unit: str = "it",
             enabled: bool = True, **kwargs):
    """A tqdm bar over `iterable` (or updated by hand: `bar.update(n)`), shown only on a terminal and where `enabled`
    (rank 0 of a multi-process run)."""
    from tqdm import tqdm

    return tqdm(iterable, total=total, desc=desc, unit=unit, disable=not (enabled and interactive()),
                dynamic_ncols=True, **kwargs)


def folder_bytes(folder: Path) -> int:
    """Bytes in the files under `folder` (0 before it exists; a file removed while counting counts 0)."""
    total = 0
    for path in folder.rglob("*"):
        with contextlib.suppress(FileNotFoundError):
            if path.is_file():
                total += path.stat().st_size
    return total


@contextlib.contextmanager
def folder_progress(folder: Path, *, total: int | None, desc: str, enabled: bool = True, every_s: float = 0.5):
    """A bar of the bytes written under `folder` while the body runs, for a library's save that reports nothing
    (DeepSpeed's save_checkpoint): polled every `every_s` by a thread, only where the bar shows. `total` (the bytes
    expected, if known) adds the fraction and time left; without it the bar shows bytes and rate."""
    with progress(total=total, desc=desc, unit="B", unit_scale=True, unit_divisor=1024, enabled=enabled) as bar:
        if bar.disable:
            yield
            return
        stop = threading.Event()

        def poll():
            while not stop.wait(every_s):
                bar.update(folder_bytes(folder) - bar.n)

        thread = threading.Thread(target=poll, name="folder-progress", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()
            bar.update(folder_bytes(folder) - bar.n)

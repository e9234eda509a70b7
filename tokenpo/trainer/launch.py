"""Starting the processes of a multi-process run.

Two ways in:
- `trainer.nproc=N`: the Hydra job starts N local worker processes itself (so `-m` sweeps work unchanged);
  workers join one process group through the usual RANK / WORLD_SIZE / MASTER_* variables and share the
  job's run dir. If one fails, the others are stopped and the job fails with its exit code; SIGTERM/SIGINT
  sent to the job are forwarded once to every worker (they save a checkpoint and exit). If the job dies without
  a word (SIGKILL, the OOM killer), its workers are killed with it (`die_with_launcher`).
- an external launcher (torchrun, `deepspeed` incl. --hostfile, or anything that sets WORLD_SIZE): every rank
  runs Hydra's main. Only rank 0 keeps Hydra's run dir; the other ranks point Hydra at a private temporary
  folder (removed at exit) and take rank 0's run dir by broadcast once the process group is up.
- a submitit job of several tasks (`hydra/launcher=submitit_slurm` or `submitit_local` with tasks_per_node > 1,
  on one or several nodes): every task runs the Hydra job; `adopt_submitit_environment` turns the job's Slurm /
  submitit variables into torchrun's, and only rank 0 writes the job's run dir.
"""

from __future__ import annotations

import atexit
import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

RESOLVED = "resolved_config.json"
# environment variable: the pid of the job that started a worker (the worker dies with it)
LAUNCHER_PID = "TOKENPO_LAUNCHER_PID"
# prctl option from <linux/prctl.h>: the signal this process gets when its parent dies
PR_SET_PDEATHSIG = 1
# seconds between parent checks where PR_SET_PDEATHSIG is unavailable
PARENT_POLL_S = 0.5
# seconds a worker gets to exit after SIGTERM once another worker failed, before SIGKILL
STOP_GRACE_S = 10.0
POLL_S = 0.2


def external_world_size() -> int:
    """WORLD_SIZE set by torchrun / the deepspeed launcher / our own launcher (1 when absent)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def adopt_submitit_environment() -> bool:
    """In a submitit job of several tasks: export the variables torchrun would set (RANK, WORLD_SIZE, LOCAL_RANK,
    LOCAL_WORLD_SIZE, MASTER_ADDR = the job's first node, MASTER_PORT drawn from the job id), read by submitit's
    job environment from SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID / SLURM_JOB_NODELIST (or submitit's local
    executor's SUBMITIT_LOCAL_*). True when it did; a launcher's own WORLD_SIZE (torchrun inside the job) wins."""
    if not os.environ.get("SUBMITIT_EXECUTOR") or "WORLD_SIZE" in os.environ:
        return False
    from submitit.helpers import TorchDistributedEnvironment

    env = TorchDistributedEnvironment()
    if env.world_size == 1:
        return False
    # every task sees all of its node's GPUs; tokenpo.deepspeed.dist picks the one of LOCAL_RANK
    env.export(set_cuda_visible_devices=False)
    return True


def local_world_size() -> int:
    """Processes per node under an external launcher (LOCAL_WORLD_SIZE; 1 when absent)."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", "1"))


def external_launcher_argv(argv: list[str]) -> list[str]:
    """Hydra's command line for this process under an external launcher.

    The deepspeed launcher appends `--local_rank=N` (LOCAL_RANK is in the environment too): dropped, Hydra would
    reject it. Ranks other than 0 get a private Hydra output folder, so a `${now:...}` run dir that resolves a
    second later on them never leaves a stray folder; they use rank 0's run dir (see `tokenpo.train`).
    """
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--local_rank":
            skip = True
        elif not arg.startswith("--local_rank="):
            out.append(arg)
    if external_world_size() > 1 and int(os.environ.get("RANK", "0")) != 0:
        private = tempfile.mkdtemp(prefix="tokenpo-rank-")
        atexit.register(shutil.rmtree, private, True)
        # appended last, so they win over a user's hydra.run.dir / hydra.sweep.dir
        out += [f"hydra.run.dir='{private}'", f"hydra.sweep.dir='{private}'"]
    return out


def worker_env(rank: int, nproc: int, port: int) -> dict[str, str]:
    return dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(nproc), LOCAL_WORLD_SIZE=str(nproc),
                MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), **{LAUNCHER_PID: str(os.getpid())})


def die_with_launcher() -> None:
    """Called first in a worker: SIGKILL it as soon as the job that started it dies, however the job died.

    A worker that outlives its job trains on and writes `final/` into a run dir that a restart uses as well.
    Linux: the kernel sends the signal (PR_SET_PDEATHSIG; it tracks the thread that started the worker, the job's
    main thread, which lives as long as the job). Elsewhere a daemon thread polls the parent pid."""
    launcher = int(os.environ[LAUNCHER_PID])
    prctl = getattr(ctypes.CDLL(None, use_errno=True), "prctl", None) if sys.platform == "linux" else None
    if prctl is not None:
        if prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL)) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    else:
        threading.Thread(target=_watch_parent, args=(launcher,), name="tokenpo-watch-launcher", daemon=True).start()
    # the job may have died before the line above: the worker was re-parented already
    if os.getppid() != launcher:
        os.kill(os.getpid(), signal.SIGKILL)


def _watch_parent(launcher: int) -> None:
    while os.getppid() == launcher:
        time.sleep(PARENT_POLL_S)
    os.kill(os.getpid(), signal.SIGKILL)


def exit_status(returncode: int) -> int:
    """A shell-style exit status: a worker killed by signal S (returncode -S) becomes 128 + S."""
    return 128 - returncode if returncode < 0 else returncode


def supervise(procs: list[subprocess.Popen], grace_s: float = STOP_GRACE_S) -> tuple[int, int | None]:
    """Wait for every worker. The first failure stops the others (SIGTERM, then SIGKILL after `grace_s`);
    SIGTERM/SIGINT received here are forwarded to the workers, which save and exit.

    Returns (exit status of the first failure or 0, the signal forwarded or None).
    """
    forwarded: list[int] = []

    def forward(signum, frame) -> None:
        forwarded.append(signum)
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        status, deadline = 0, None
        running = list(procs)
        while running:
            for proc in list(running):
                ret = proc.poll()
                if ret is None:
                    continue
                running.remove(proc)
                if ret != 0 and status == 0:
                    status = exit_status(ret)
                    deadline = time.monotonic() + grace_s
                    for other in running:
                        other.terminate()
            if deadline is not None and time.monotonic() > deadline:
                for other in running:
                    other.kill()
                deadline = None
            time.sleep(POLL_S)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return status, (forwarded[0] if forwarded else None)


def launch_local_workers(nproc: int, run_dir: Path, name: str, group: str, resolved: dict) -> dict | None:
    """Run `python -m tokenpo.trainer.worker <run_dir>` N times; rank 0's summary (None if it wrote none).

    Raises SystemExit with the first failing worker's status."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / RESOLVED).write_text(json.dumps({"config": resolved, "name": name, "group": group}))
    from tokenpo.deepspeed.dist import free_port  # here: dist imports torch, and start-up checks run without it

    port = free_port()
    # own session: a terminal's Ctrl-C reaches the job only, which forwards it once (a second one aborts)
    procs = [subprocess.Popen([sys.executable, "-m", "tokenpo.trainer.worker", str(run_dir)],
                              env=worker_env(rank, nproc, port), start_new_session=True) for rank in range(nproc)]
    status, _ = supervise(procs)
    if status:
        raise SystemExit(status)
    summary = run_dir / "summary.json"
    return json.loads(summary.read_text()) if summary.is_file() else None

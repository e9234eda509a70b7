"""Starting the processes of a multi-process run, and stopping them cleanly.

Four ways in:
- `trainer.nproc=N`: the Hydra job starts N local worker processes itself (so `-m` sweeps work unchanged);
  workers join one process group through the usual RANK / WORLD_SIZE / MASTER_* variables and share the
  job's run dir. If one fails, the others are stopped and the job fails with its exit code; a stop signal
  (`STOP_SIGNALS`) sent to the job is forwarded once to every worker (they save a checkpoint and exit). If the
  job dies without a word (SIGKILL, the OOM killer), its workers are killed with it (`die_with_launcher`).
- an external launcher (torchrun, `deepspeed` incl. --hostfile, or anything that sets WORLD_SIZE): every rank
  runs Hydra's main. Only rank 0 keeps Hydra's run dir; the other ranks point Hydra at a private temporary
  folder (removed at exit) and take rank 0's run dir by broadcast once the process group is up.
- a submitit job of several tasks (`hydra/launcher=submitit_slurm` or `submitit_local` with tasks_per_node > 1,
  on one or several nodes): every task runs the Hydra job; `adopt_submitit_environment` turns the job's Slurm /
  submitit variables into torchrun's, and only rank 0 writes the job's run dir.
- `srun python -m tokenpo.train` with several tasks (no torchrun inside): `slurm_ranks` reads Slurm's own task
  variables into torchrun's, so the tasks train as one run.

A stop signal makes the run save a checkpoint and exit at the end of its step (`StopRequest`). After SIGUSR1/SIGUSR2
(the warning Slurm's --signal and submitit send before a time limit or a preemption) `hand_over_stop` then gets the
job requeued, and the requeued job resumes from that checkpoint.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass

from tokenpo.errors import ConfigError
from tokenpo.lifeline import die_with_parent
from tokenpo.trainer.harness.identity import RunIdentity
from tokenpo.trainer.harness.rundir import RESOLVED
from tokenpo.trainer.harness.stop import STOP_SIGNALS

log = logging.getLogger("tokenpo")

# environment variable: the pid of the job that started a worker (the worker dies with it)
LAUNCHER_PID = "TOKENPO_LAUNCHER_PID"
# seconds a worker gets to exit after SIGTERM once another worker failed, before SIGKILL
STOP_GRACE_S = 10.0
POLL_S = 0.2
# the stop signals that ask for a requeue once the checkpoint is saved
REQUEUE_SIGNALS = (signal.SIGUSR1, signal.SIGUSR2)
# variables a launcher (torchrun, the deepspeed launcher, tokenpo's own) sets: with any of them, its ranks win
LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK")
# Slurm job ids' last digits + this = the master port every task derives alike (Lightning's SLURMEnvironment)
SLURM_PORT_BASE = 15000


@dataclass(frozen=True)
class Ranks:
    """The variables torchrun sets for one process of a run."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    master_addr: str
    master_port: int

    def export(self) -> None:
        os.environ.update(RANK=str(self.rank), LOCAL_RANK=str(self.local_rank), WORLD_SIZE=str(self.world_size),
                          LOCAL_WORLD_SIZE=str(self.local_world_size), MASTER_ADDR=self.master_addr,
                          MASTER_PORT=str(self.master_port))


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
    Ranks(env.rank, env.local_rank, env.world_size, env.local_world_size, env.master_addr, env.master_port).export()
    return True


def first_host(nodelist: str) -> str:
    """The first host of a Slurm node list in its compressed syntax: `node[01-04,07]` -> node01, `a1,b[2-3]` -> a1,
    `rack[1-2]-gpu[3-4]` -> rack1-gpu3 (what `scontrol show hostnames` prints first)."""
    first = re.match(r"(?:[^,\[]|\[[^\]]*\])+", nodelist)
    if first is None:
        raise ConfigError(f"SLURM_NODELIST={nodelist!r} names no host: set MASTER_ADDR to the first node's address")
    return re.sub(r"\[([^\],-]+)[^\]]*\]", r"\1", first.group(0))


def tasks_on_node(tasks_per_node: str, node: int) -> int:
    """Tasks on node `node` from SLURM_TASKS_PER_NODE (`4(x2),3`: 4 on nodes 0 and 1, 3 on node 2)."""
    counts = []
    for part in tasks_per_node.split(","):
        count, _, repeat = part.partition("(x")
        counts += [int(count)] * int(repeat.rstrip(")") or 1)
    return counts[node]


def slurm_ranks(env: Mapping[str, str]) -> Ranks | None:
    """torchrun's variables for one task of `srun` with several tasks, from Slurm's own (SLURM_PROCID, SLURM_LOCALID,
    SLURM_NTASKS, the first host of SLURM_NODELIST, a port from SLURM_JOB_ID; a MASTER_ADDR / MASTER_PORT already set
    wins), as Lightning's SLURMEnvironment reads them. None outside such a task, or under a launcher that set its own
    ranks (torchrun inside the job)."""
    if int(env.get("SLURM_NTASKS", "1")) < 2 or "SLURM_PROCID" not in env or any(v in env for v in LAUNCHER_VARS):
        return None
    world = int(env["SLURM_NTASKS"])
    return Ranks(rank=int(env["SLURM_PROCID"]), local_rank=int(env.get("SLURM_LOCALID", "0")), world_size=world,
                 local_world_size=tasks_on_node(env.get("SLURM_TASKS_PER_NODE", str(world)),
                                                int(env.get("SLURM_NODEID", "0"))),
                 master_addr=env.get("MASTER_ADDR") or first_host(env.get("SLURM_NODELIST", "")),
                 master_port=int(env.get("MASTER_PORT") or SLURM_PORT_BASE + int(env["SLURM_JOB_ID"][-4:])))


def adopt_slurm_environment() -> bool:
    """In a task of `srun` with several tasks: export torchrun's variables (`slurm_ranks`); True when it did."""
    ranks = slurm_ranks(os.environ)
    if ranks is None:
        return False
    ranks.export()
    return True


def check_local_devices(nproc: int, visible: int) -> None:
    """trainer.nproc local workers take a CUDA device each; `visible` 0 (no CUDA): nothing to check."""
    if visible and nproc > visible:
        raise ConfigError(f"trainer.nproc={nproc} but this machine has {visible} visible CUDA device(s) "
                          "(CUDA_VISIBLE_DEVICES): one per process")


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

    A worker that outlives its job trains on and writes `final/` into a run dir that a restart uses as well. The job
    starts its workers from its main thread, which lives as long as the job (`die_with_parent`)."""
    die_with_parent(int(os.environ[LAUNCHER_PID]))


def exit_status(returncode: int) -> int:
    """A shell-style exit status: a worker killed by signal S (returncode -S) becomes 128 + S."""
    return 128 - returncode if returncode < 0 else returncode


def supervise(procs: list[subprocess.Popen], grace_s: float = STOP_GRACE_S) -> tuple[int, int | None]:
    """Wait for every worker. The first failure stops the others (SIGTERM, then SIGKILL after `grace_s`);
    stop signals (`STOP_SIGNALS`) received here are forwarded to the workers, which save and exit.

    Returns (exit status of the first failure or 0, the signal forwarded or None).
    """
    forwarded: list[int] = []

    def forward(signum, frame) -> None:
        forwarded.append(signum)
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in STOP_SIGNALS}
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


class Requeued(SystemExit):
    """The job's scheduler requeued it after its checkpoint (submitit exits -1): not a failure, its rerun resumes."""


def slurm_job_to_requeue(env: Mapping[str, str]) -> str | None:
    """The id `scontrol requeue` takes for this Slurm job (`<array job>_<task>` for an array's job, as Lightning
    names it), None outside Slurm."""
    if "SLURM_ARRAY_JOB_ID" in env:
        return f"{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}"
    return env.get("SLURM_JOB_ID")


def hand_over_stop(signum: int | None, rank0: bool) -> None:
    """After a run stopped by `signum` saved its checkpoint: get the job requeued when `signum` asked for it.

    A handler the job had for that signal before the run (submitit's for SIGUSR2: on rank 0 it requeues the job and
    exits -1, raised here as `Requeued`) runs now. In a Slurm job with no such handler (`sbatch --signal=USR1@120`),
    rank 0 runs `scontrol requeue`, as Lightning's SLURMEnvironment does on SIGUSR1; the requeued job runs the same
    command, and trainer.resume=auto continues from the checkpoint."""
    if signum not in REQUEUE_SIGNALS:
        return
    handler = signal.getsignal(signum)
    if callable(handler):
        try:
            handler(signum, None)
        except SystemExit as exit_:
            raise Requeued(exit_.code) from None
        return
    job = slurm_job_to_requeue(os.environ)
    if job is None or not rank0:
        return
    try:
        result = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as err:
        log.warning("could not requeue Slurm job %s: %s", job, err)
        return
    if result.returncode:
        log.warning("scontrol requeue %s failed (status %d): %s", job, result.returncode, result.stderr.strip())
    else:
        log.info("requeued Slurm job %s: it resumes from this checkpoint", job)


def launch_local_workers(nproc: int, identity: RunIdentity) -> dict | None:
    """Run `python -m tokenpo.trainer.processes.worker <run_dir>` N times; rank 0's summary (None if it wrote none).

    Raises SystemExit with the first failing worker's status."""
    run_dir = identity.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / RESOLVED).write_text(json.dumps({"config": identity.config, "name": identity.name,
                                                "group": identity.group}))
    from tokenpo.deepspeed.dist import free_port  # here: dist imports torch, and start-up checks run without it

    port = free_port()
    # own session: a terminal's Ctrl-C reaches the job only, which forwards it once (a second one aborts)
    procs = [subprocess.Popen([sys.executable, "-m", "tokenpo.trainer.processes.worker", str(run_dir)],
                              env=worker_env(rank, nproc, port), start_new_session=True) for rank in range(nproc)]
    status, _ = supervise(procs)
    if status:
        raise SystemExit(status)
    summary = run_dir / "summary.json"
    return json.loads(summary.read_text()) if summary.is_file() else None

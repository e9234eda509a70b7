"""`trainer.nproc=N`: the Hydra job starts N local worker processes itself (so `-m` sweeps work unchanged).

Workers join one process group through the usual RANK / WORLD_SIZE / MASTER_* variables and share the
job's run dir; if one fails, the others are stopped and the job fails with its exit code.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from tokenpo.deepspeed.dist import free_port

RESOLVED = "resolved_config.json"


def launch_local_workers(nproc: int, run_dir: Path, name: str, group: str, resolved: dict) -> float | None:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / RESOLVED).write_text(json.dumps({"config": resolved, "name": name, "group": group}))
    port = str(free_port())
    procs = []
    for rank in range(nproc):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(nproc),
                   LOCAL_WORLD_SIZE=str(nproc), MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
        procs.append(subprocess.Popen([sys.executable, "-m", "tokenpo.trainer.worker", str(run_dir)], env=env))
    code = 0
    while procs:
        for proc in list(procs):
            ret = proc.poll()
            if ret is None:
                continue
            procs.remove(proc)
            if ret != 0 and code == 0:
                code = ret
                for other in procs:
                    other.terminate()
        time.sleep(0.2)
    if code:
        raise SystemExit(code)
    summary = run_dir / "summary.json"
    return json.loads(summary.read_text()).get("eval_after") if summary.is_file() else None

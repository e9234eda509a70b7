"""Run as 2 ranks (gloo) by test_checkpoint_ranks.py: save checkpoints 1 and 2 of a ZeRO-2-like engine, look up the
one to resume, flip a byte in rank 1's optimizer shard of step 2 and look up again. Each rank writes
<out>/rank<r>.json: the files it checksummed at each phase and the checkpoint it was told to resume from."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import torch
import torch.distributed

from tokenpo.deepspeed import dist
from tokenpo.trainer.harness import checkpoint
from tokenpo.trainer.harness import checkpoint_manifest
from tokenpo.trainer.core.policy import Policy, PolicySettings
from tokenpo.trainer.harness.state import save_policy


class ShardedEngine:
    """Writes `state/` as DeepSpeed's ZeRO-2 does: rank 0 the model states, every rank its optimizer shard."""

    def zero_optimization_stage(self):
        return 2

    def save_checkpoint(self, save_dir, tag, client_state, save_latest):
        state = Path(save_dir) / tag
        state.mkdir(parents=True, exist_ok=True)
        if dist.is_main():
            (state / "mp_rank_00_model_states.pt").write_bytes(b"model" * 1000)
        (state / f"zero_pp_rank_{dist.rank()}_mp_rank_00_optim_states.pt").write_bytes(bytes([dist.rank()]) * 3000)


def main(out: Path) -> None:
    torch.distributed.init_process_group("gloo")
    logging.basicConfig(level=logging.WARNING, stream=sys.stdout, format="%(message)s")
    checksummed: list[str] = []
    recorded = checkpoint_manifest.file_crc32

    def recording(path: Path) -> str:
        checksummed.append(f"{path.parent.name}/{path.name}" if path.parent.name == "state" else path.name)
        return recorded(path)

    checkpoint_manifest.file_crc32 = recording
    policy = Policy(ShardedEngine(), None, None, torch.device("cpu"), PolicySettings(1.0, 1024, False, None))
    run_dir = out / "run"
    phases = {}
    for step in (1, 2):
        save_policy(policy, run_dir / "checkpoints", step, {"step": step}, keep_last=2, with_checksums=True)
        phases[f"save {step}"], checksummed[:] = list(checksummed), []
    resumed = {"intact": checkpoint.find_resume_dir("auto", run_dir)}
    phases["verify intact"], checksummed[:] = list(checksummed), []
    if dist.is_main():
        shard = run_dir / "checkpoints" / "step_000002" / "state" / "zero_pp_rank_1_mp_rank_00_optim_states.pt"
        data = bytearray(shard.read_bytes())
        data[10] ^= 0xFF
        shard.write_bytes(bytes(data))
    torch.distributed.barrier()
    resumed["damaged"] = checkpoint.find_resume_dir("auto", run_dir)
    phases["verify damaged"] = list(checksummed)
    result = {"checksummed": phases, "resumed": {k: str(v) for k, v in resumed.items()}}
    (out / f"rank{dist.rank()}.json").write_text(json.dumps(result))
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))

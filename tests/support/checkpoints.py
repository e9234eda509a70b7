"""A stand-in for the DeepSpeed engine's checkpoint files, and damage to do to them."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from tokenpo.trainer.core.policy import Policy, PolicySettings
from tokenpo.trainer.harness.state import save_policy


class FakeEngine:
    """Writes and reads `state/` like DeepSpeedEngine.save_checkpoint / load_checkpoint (tag folder + client state)."""

    def __init__(self, fail_after_partial: bool = False, stage: int = 2):
        self.fail_after_partial = fail_after_partial
        self.stage = stage

    def zero_optimization_stage(self):
        return self.stage

    def save_checkpoint(self, save_dir, tag, client_state, save_latest):
        state = Path(save_dir) / tag
        state.mkdir(parents=True)
        (state / "part0.pt").write_text("shard")
        if self.fail_after_partial:
            raise KeyboardInterrupt("killed while writing")
        (state / "client.json").write_text(json.dumps(client_state))

    def load_checkpoint(self, load_dir, tag, load_optimizer_states, load_lr_scheduler_states):
        state = Path(load_dir) / tag
        return load_dir, json.loads((state / "client.json").read_text())


def policy(engine: FakeEngine | None = None) -> Policy:
    """A full fine-tuning policy around `engine` (default: a FakeEngine at ZeRO-2)."""
    return Policy(engine or FakeEngine(), None, None, torch.device("cpu"), PolicySettings(1.0, 1024, False, None))


def save(engine, root: Path, step: int, client_state: dict, keep_last: int, with_checksums: bool = True) -> Path:
    return save_policy(policy(engine), root, step, client_state, keep_last=keep_last, with_checksums=with_checksums)


def saved_run(tmp_path: Path, steps=(1, 2), keep_last: int = 2) -> Path:
    """A run dir with checkpoints of `steps`; returns its checkpoints folder."""
    root = tmp_path / "run" / "checkpoints"
    for step in steps:
        save(FakeEngine(), root, step, {"step": step}, keep_last=keep_last)
    return root


def flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))

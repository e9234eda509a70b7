"""Where a run stands (`RunState`: what a checkpoint carries besides the model), and the harness that resumes and
saves it: the policy's state (Policy.write_state / read_state) in a checkpoint folder (tokenpo.trainer.harness.checkpoint)
with this rank's RNG states.

A checkpoint's RNG files hold tensors and numbers only and are read with `weights_only=True`; DeepSpeed's own state
files are pickles that it loads with `weights_only=False`, so resume only from checkpoints you trust."""

from __future__ import annotations

import logging
import pickle
import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from tokenpo.algorithms.entropy_control import EntropyCoef
from tokenpo.data import PromptSampler
from tokenpo.logger.run_logger import SAMPLES_FILE
from tokenpo.deepspeed import dist
from tokenpo.trainer.harness import checkpoint
from tokenpo.trainer.harness.checkpoint_manifest import CheckpointError
from tokenpo.trainer.core.policy import Policy

log = logging.getLogger("tokenpo")


@dataclass
class RunState:
    """What a checkpoint carries besides the model and optimizer: the step, the prompt sampler's position, the W&B
    run id, the running totals and the entropy coefficient's state. On disk it is the client state `{"step",
    "sampler", "wandb_id", "history"}` with the totals and the held-out accuracies in `history` (the keys of the
    checkpoints written so far), and `"entropy_coef": {"c", "active"}` and `"health"` (trainer.health's counts and
    entropy reference: tokenpo.trainer.harness.health.Detectors.state_dict) once a step has run."""

    step: int = 0
    sampler: dict | None = None  # PromptSampler.state_dict()
    wandb_id: str | None = None
    generated_tokens: int = 0  # response tokens generated so far, every dynamic-sampling round's included
    elapsed_s: float = 0.0  # training seconds so far (the evaluation before training excluded)
    eval_before: float | None = None  # held-out accuracy before training
    eval_after: float | None = None  # held-out accuracy after the last step
    # the entropy coefficient's state the next step starts from (adaptive entropy control's c_k and gate); None
    # before the first step, and in checkpoints written before it existed: the step then starts from the config's
    entropy_coef: EntropyCoef | None = None
    # rollouts sampled ahead of the update (rollout.async.max_staleness >= 1) and not trained on yet, one state per
    # rank (its own generator's rounds: tokenpo.trainer.core.source.RolloutSource.state_dict); None before a checkpoint
    in_flight: list[dict] | None = None
    health: dict | None = None  # trainer.health's detectors after the last step (None before the first)

    def to_client_state(self) -> dict:
        history = {"generated_tokens": self.generated_tokens, "elapsed_s": self.elapsed_s}
        history.update({key: value for key, value in (("eval_before", self.eval_before),
                                                      ("eval_after", self.eval_after)) if value is not None})
        client = {"step": self.step, "sampler": self.sampler, "wandb_id": self.wandb_id, "history": history}
        if self.entropy_coef is not None:
            client["entropy_coef"] = {"c": self.entropy_coef.c, "active": self.entropy_coef.active}
        if self.in_flight is not None:
            client["in_flight"] = self.in_flight
        if self.health is not None:
            client["health"] = self.health
        return client

    @classmethod
    def from_client_state(cls, state: dict) -> RunState:
        history, coef = state.get("history", {}), state.get("entropy_coef")
        return cls(step=state["step"], sampler=state["sampler"], wandb_id=state.get("wandb_id"),
                   generated_tokens=history.get("generated_tokens", 0), elapsed_s=history.get("elapsed_s", 0.0),
                   eval_before=history.get("eval_before"), eval_after=history.get("eval_after"),
                   entropy_coef=None if coef is None else EntropyCoef(float(coef["c"]), bool(coef["active"])),
                   in_flight=state.get("in_flight"), health=state.get("health"))


def resume_run(policy: Policy, sampler: PromptSampler, resume: str, run_dir: Path, *,
               with_checksums: bool) -> tuple[RunState, bool]:
    """(the run's state, whether it resumed): the checkpoint trainer.resume (`resume`) names restored into `policy`
    and `sampler`, or a fresh state. Checkpoints after the one resumed are set aside, and the metrics and samples
    logged after it (or by a whole earlier attempt) trimmed: those steps are logged again."""
    resume_dir = checkpoint.find_resume_dir(resume, run_dir, with_checksums=with_checksums)
    checkpoint.set_aside_stale(run_dir / "checkpoints", resume_dir)
    state = RunState()
    if resume_dir is not None:
        state = RunState.from_client_state(load_policy(policy, resume_dir))
        sampler.load_state_dict(state.sampler)
        log.info("resumed from %s at step %d", resume_dir, state.step)
    for log_file in ("metrics.jsonl", SAMPLES_FILE):
        checkpoint.trim_metrics(run_dir / log_file, state.step if resume_dir is not None else -1)
    return state, resume_dir is not None


def save_run(policy: Policy, state: RunState, run_dir: Path, *, keep_last: int, with_checksums: bool) -> None:
    """Checkpoint the policy at `state.step` with the state as its client state (a collective: every rank)."""
    save_policy(policy, run_dir / "checkpoints", state.step, state.to_client_state(), keep_last=keep_last,
                with_checksums=with_checksums)


def save_policy(policy: Policy, root: Path, step: int, client_state: dict, *, keep_last: int,
                with_checksums: bool) -> Path:
    """Checkpoint `step` under `root` on every rank (a collective): the policy's state with `client_state`, and this
    rank's RNG states. Keeps the newest `keep_last`; `with_checksums`: the manifest records crc32s, not sizes
    alone."""

    def write_state(folder: Path) -> None:
        policy.write_state(folder, checkpoint.TAG, client_state)
        torch.save(rng_state(), checkpoint.rng_file(folder, dist.rank()))

    meta = checkpoint.CheckpointMeta(step, dist.world_size(), policy.zero_stage, policy.adapters)
    return checkpoint.save(root, meta, write_state, keep_last=keep_last, with_checksums=with_checksums)


def load_policy(policy: Policy, path: Path) -> dict:
    """The policy's state (model, optimizer) and this rank's RNG states back from checkpoint `path` (one whose
    manifest was verified: checkpoint.find_resume_dir); the client state saved with it."""
    checkpoint.check_resumable(path, checkpoint.read_meta(path), dist.world_size(), policy.zero_stage,
                               policy.adapters)
    # read before DeepSpeed unpickles anything, so that a refused file stops the load early
    rng = load_rng(checkpoint.rng_file(path, dist.rank()))
    client_state = policy.read_state(path, checkpoint.TAG)
    if client_state is None:
        raise CheckpointError(f"checkpoint {path}: DeepSpeed could not load it (see its log above)")
    set_rng_state(rng)
    return client_state


def rng_state() -> dict:
    """Tensors, strings and numbers only, so that `torch.load(weights_only=True)` reads it back."""
    name, key, pos, has_gauss, gauss = np.random.get_state()
    numpy_state = (name, torch.from_numpy(key.astype(np.int64)), pos, has_gauss, gauss)
    state = {"python": random.getstate(), "numpy": numpy_state, "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    name, key, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((name, np.asarray(key, dtype=np.uint32), pos, has_gauss, gauss))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def load_rng(path: Path) -> dict:
    """A rank's RNG states, read as tensors and numbers only: a pickled object in the file (numpy's key as an ndarray,
    as an earlier tokenpo wrote it, or anything else) is refused, not run."""
    if not path.is_file():
        raise CheckpointError(f"{path}: missing")
    try:
        return torch.load(path, weights_only=True)
    except pickle.UnpicklingError:
        raise CheckpointError(f"{path}: holds objects other than tensors and numbers (refused, not run)") from None
    except (RuntimeError, EOFError, OSError, ValueError) as err:
        reason = str(err).strip().splitlines()[:1]
        raise CheckpointError(f"{path}: unreadable ({type(err).__name__}: {''.join(reason)})") from None


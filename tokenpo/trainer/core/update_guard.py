"""Between the policy's gradients and its weights: no non-finite update reaches the weights, and one the step's
health checks may veto waits for them (trainer.health; tokenpo.trainer.harness.health reads the checks, the policy commits
or skips the update it holds)."""

from __future__ import annotations

import torch

from tokenpo.deepspeed import dist


def _grads_finite(optimizer: torch.optim.Optimizer) -> bool:
    """Whether every gradient the optimizer is about to apply is finite (their total norm is: a NaN or an infinity
    anywhere makes it NaN or infinite)."""
    by_device: dict[torch.device, list[torch.Tensor]] = {}  # one host sync per device (offload: the CPU)
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.grad is not None:
                by_device.setdefault(p.grad.device, []).append(torch.linalg.vector_norm(p.grad.detach()).float())
    return all(bool(torch.isfinite(torch.stack(norms)).all()) for norms in by_device.values())


class UpdateGuard:
    """Between the policy's gradients and its weights. `step(engine)` runs `engine.step()` with the torch optimizer's
    own step checked: not called when this update's loss was non-finite on any process, when its gradients are not
    finite, or when the update is vetoed; DeepSpeed zeroes the gradients as after any step. Under ZeRO 1-3 and bf16
    DeepSpeed skips an update whose global gradient norm is not finite before it reaches that step; the guard counts
    that too. With `hold` (set by HealthMonitor) each update waits until `release` (the step's checks) or `flush`
    (a pass about to read the weights)."""

    def __init__(self, optimizer: torch.optim.Optimizer | None) -> None:
        self.hold = False
        self.skipped = 0  # updates not applied, since the last take()
        self.nonfinite = 0  # of them, for a non-finite loss or gradient
        self._engine = None  # the engine whose step is held
        self._loss_bad: torch.Tensor | None = None  # this process's losses since the last update: any non-finite
        self._veto = self._applied = self._grads_bad = False
        if optimizer is not None:
            optimizer_step = optimizer.step

            def guarded_step(*args, **kwargs):
                # ZeRO 1/2 call it once per parameter group, ZeRO-3 once per sub-group: the veto covers them all
                if self._veto:
                    return None
                if not _grads_finite(optimizer):
                    self._grads_bad = True
                    return None
                self._applied = True
                return optimizer_step(*args, **kwargs)

            optimizer.step = guarded_step

    def note_loss(self, loss: torch.Tensor) -> None:
        """A loss about to be back-propagated (kept as a tensor: no device sync per micro-batch)."""
        bad = ~torch.isfinite(loss.detach())
        self._loss_bad = bad if self._loss_bad is None else self._loss_bad | bad

    def step(self, engine) -> None:
        self.flush()
        if self.hold:
            self._engine = engine
        else:
            self._apply(engine, veto=False)

    def flush(self) -> None:
        """Apply a held update now (a pass is about to read the weights: the next mini-batch's)."""
        if self._engine is not None:
            engine, self._engine = self._engine, None
            self._apply(engine, veto=False)

    def release(self, veto: bool) -> bool:
        """The held update applied, or skipped (`veto`); whether one was held."""
        engine, self._engine = self._engine, None
        if engine is not None:
            self._apply(engine, veto)
        return engine is not None

    def take(self) -> tuple[int, int]:
        """(updates skipped, of them non-finite) since the last call."""
        counts, self.skipped, self.nonfinite = (self.skipped, self.nonfinite), 0, 0
        return counts

    def _loss_nonfinite(self) -> bool:
        bad = self._loss_bad is not None and bool(self._loss_bad)
        self._loss_bad = None
        # every process decides alike: each calls this once per update
        return any(dist.all_gather_objects(bad)) if dist.world_size() > 1 else bad

    def _apply(self, engine, veto: bool) -> None:
        loss_bad = self._loss_nonfinite()
        self._veto, self._applied, self._grads_bad = veto or loss_bad, False, False
        try:
            engine.step()
        finally:
            self._veto = False
        if not self._applied:
            self.skipped += 1
        # not applied and not vetoed here: DeepSpeed found the global gradient norm non-finite
        if loss_bad or self._grads_bad or not (self._applied or veto):
            self.nonfinite += 1

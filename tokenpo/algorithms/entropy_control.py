"""The entropy bonus's coefficient from step to step: fixed (`algorithm.loss.entropy_coef`), or Skywork-OR1's adaptive
entropy control (arXiv 2505.22312, MAGIC's loss function, "Adaptive Entropy Control").

Adaptive control carries c_k in the run state (a checkpoint holds it): after step k, whose batch entropy was e_k,
    c_{k+1} = clip(c_k + Δ if e_k < H* else c_k − Δ, 0, c_max)
and step k+1 uses α_{k+1} = c_{k+1} · 1[e_k < H*]: the bonus only acts while the entropy is below the target. That is
the reference code's EntController (SkyworkAI/Skywork-OR1 verl/trainer/ppo/core_algos.py, updated after each step
in ray_trainer.py), whose first step is active with c_0 = the initial coefficient. Torch-free: the schema validates
`entropy_control` against ENTROPY_CONTROLS before torch is imported.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tokenpo.algorithms.config import LossConfig

# fixed: algorithm.loss.entropy_coef every step; adaptive: Skywork-OR1's controller
ENTROPY_CONTROLS = ("fixed", "adaptive")


@dataclass(frozen=True)
class EntropyCoef:
    """The controller's state for one step: c_k and whether the bonus acts (1[e_{k−1} < H*]; the first step acts)."""

    c: float
    active: bool = True

    @property
    def value(self) -> float:
        """α_k = c_k · 1[e_{k−1} < H*]: the coefficient the step's loss uses."""
        return self.c if self.active else 0.0


def adaptive_entropy_coef(coef: EntropyCoef, entropy: float, target: float, delta: float, c_max: float) -> EntropyCoef:
    """Skywork-OR1 adaptive entropy control (arXiv 2505.22312, "Adaptive Entropy Control"; reference code
    EntController.update): c ± Δ by whether the step's entropy e_k is below the target H* (tgt-ent), clipped to
    [0, c_max]; the next step's bonus acts only if e_k < H*."""
    below = entropy < target
    c = coef.c + delta if below else coef.c - delta
    return EntropyCoef(min(max(c, 0.0), c_max), below)


def step_entropy_coef(loss: LossConfig, carried: EntropyCoef | None) -> EntropyCoef:
    """The coefficient of this step: fixed mode reads `loss.entropy_coef` every step (a resume with another value
    uses it); adaptive mode continues the carried state, starting from c_0 = `loss.entropy_coef`."""
    if loss.entropy_control == "fixed" or carried is None:
        return EntropyCoef(loss.entropy_coef)
    return carried


def next_entropy_coef(loss: LossConfig, used: EntropyCoef, entropy: float | None) -> EntropyCoef:
    """The state the next step starts from, after a step that used `used` and measured `entropy` (None: the step
    made no update, so nothing was measured and the state stays)."""
    if loss.entropy_control == "fixed" or entropy is None:
        return used
    return adaptive_entropy_coef(used, entropy, loss.entropy_target, loss.entropy_coef_step, loss.entropy_coef_max)

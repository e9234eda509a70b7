"""Aggregation of per-token losses over tokens, sequences, micro-batches and ranks.

Every mode returns the LOCAL sum divided by a GLOBAL denominator (`LossNorm`, counted over the
whole step batch: all micro-batches, all ranks). Summing the results over micro-batches and
ranks therefore gives exactly the full-batch value and gradient.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from tokenpo.algorithms.masked import sequence_mean
from tokenpo.registry import Registry

# torch for annotations only: a config validates against these registries before torch is imported
if TYPE_CHECKING:
    import torch

AGGREGATIONS = Registry("aggregation mode")


@dataclass(frozen=True)
class LossNorm:
    """Global denominators of one optimiser step.

    num_tokens: real response tokens; num_seqs: responses with at least one real token;
    max_len: the constant L_max of `seq-mean-token-sum-norm` (the rollout's max_new_tokens).
    """

    num_tokens: float
    num_seqs: float
    max_len: int

    @classmethod
    def from_mask(cls, mask: torch.Tensor, max_len: int) -> LossNorm:
        """Counts of one batch's mask [B, T]; under data parallelism all-reduce (sum)
        num_tokens and num_seqs of each rank's full step batch."""
        return cls(float(mask.sum()), float((mask.sum(-1) > 0).sum()), int(max_len))


@AGGREGATIONS.register("token-mean")
def token_mean(loss_tok: torch.Tensor, mask: torch.Tensor, norm: LossNorm) -> torch.Tensor:
    """Σ L·mask / Σ mask over the global batch (DAPO token-level policy-gradient loss, arXiv 2503.14476 §3.3)."""
    return (loss_tok * mask).sum() / max(norm.num_tokens, 1.0)


@AGGREGATIONS.register("seq-mean-token-mean")
def seq_mean_token_mean(loss_tok: torch.Tensor, mask: torch.Tensor, norm: LossNorm) -> torch.Tensor:
    """(1/num_seqs) · Σ_i (Σ_t L·mask / |o_i|): the 1/G Σ_i 1/|o_i| Σ_t of the GRPO objective (DeepSeekMath
    arXiv 2402.03300 §4.1.1); GSPO (arXiv 2507.18071 Eq. 5) and GRPO-S have one term per sequence."""
    return sequence_mean(loss_tok, mask).sum() / max(norm.num_seqs, 1.0)


@AGGREGATIONS.register("seq-mean-token-sum")
def seq_mean_token_sum(loss_tok: torch.Tensor, mask: torch.Tensor, norm: LossNorm) -> torch.Tensor:
    """(1/num_seqs) · Σ_i Σ_t L·mask (verl's `seq-mean-token-sum`; no paper of ours uses it)."""
    return (loss_tok * mask).sum() / max(norm.num_seqs, 1.0)


@AGGREGATIONS.register("seq-mean-token-sum-norm")
def seq_mean_token_sum_norm(loss_tok: torch.Tensor, mask: torch.Tensor, norm: LossNorm) -> torch.Tensor:
    """Σ L·mask / (num_seqs · L_max), a constant normaliser instead of 1/|o_i| (the Dr. GRPO objective,
    arXiv 2503.20783)."""
    return (loss_tok * mask).sum() / max(norm.num_seqs * norm.max_len, 1.0)


def aggregate(loss_tok: torch.Tensor, mask: torch.Tensor, mode: str, norm: LossNorm) -> torch.Tensor:
    """Scalar loss of the registered `mode` from per-token losses [B, T]."""
    return AGGREGATIONS.get(mode)(loss_tok, mask, norm)

"""The trained model behind one interface: its DeepSpeed engine, LoRA adapters, the KL reference, checkpoint state and
export. The step calls `logprobs`, `reference_logprobs`, `backward`, `step`; nothing outside this module needs to know
whether the policy trains LoRA adapters, where its reference lives, or which ZeRO stage partitions it."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

import torch

from tokenpo import algorithms as alg
from tokenpo.config import TrainConfig
from tokenpo.deepspeed import dist
from tokenpo.deepspeed.engine import build_policy_engine, build_reference, forward_in_engine, partitioned_loading
from tokenpo.deepspeed.export import export_hf
from tokenpo.models.loading import load_model
from tokenpo.models.logprobs import response_logprobs
from tokenpo.models.lora import adapters_disabled, is_lora
from tokenpo.models.modes import no_dropout
from tokenpo.trainer import checkpoint
from tokenpo.trainer.batch import GroupTokens
from tokenpo.trainer.optim import build_optimizer


@dataclass(frozen=True)
class TokenLogprobs:
    """One forward's result over a micro-batch's rows."""

    logp: torch.Tensor  # [rows, T] log-probs of the response tokens under the rollout temperature
    entropy: torch.Tensor | None  # [rows, T] token entropy, when asked for


class Policy:
    """The trained model: its DeepSpeed engine, LoRA adapters, the KL reference, checkpoint state and export."""

    def __init__(self, cfg: TrainConfig, engine, optimizer: torch.optim.Optimizer, reference: torch.nn.Module | None,
                 device: torch.device) -> None:
        self.engine = engine  # rollout engines sync their weights from it
        self.optimizer = optimizer  # the torch optimizer inside the engine (the learning rate is set on its groups)
        self.device = device
        self._reference = reference  # the frozen copy; None without a KL term, or with LoRA (the adapters off)
        self._cfg = cfg

    @property
    def module(self) -> torch.nn.Module:
        """The trained nn.Module (a PEFT model with LoRA)."""
        return self.engine.module

    @classmethod
    def build(cls, cfg: TrainConfig, world_size: int, device: torch.device) -> tuple[object, Policy]:
        """(tokenizer, policy): the model loaded (partitioned under ZeRO-3), the reference when the algorithm needs one
        (a frozen copy; with LoRA none: the policy's own module with its adapters off is the initial policy), the
        optimizer at step 1's learning rate, the engine. The caller seeds torch first (the weights of a LoRA adapter
        and a tiny model are drawn from it)."""
        sizes = dict(micro_batch_size=cfg.trainer.micro_batch_size, max_grad_norm=cfg.trainer.max_grad_norm,
                     world_size=world_size)
        partitioned = partitioned_loading(cfg.deepspeed, **sizes)
        tokenizer, model = load_model(cfg.model, cfg.seed, partitioned)
        reference = None
        if alg.needs_reference(cfg.algorithm) and not cfg.model.lora.enabled:
            reference = build_reference(model, cfg.deepspeed, **sizes,
                                        load_initial=lambda: load_model(cfg.model, cfg.seed, partitioned)[1])
            reference.to(device)
        optimizer = build_optimizer(model, cfg.trainer)
        engine = build_policy_engine(model, optimizer, cfg.deepspeed, **sizes)
        return tokenizer, cls(cfg, engine, optimizer, reference, device)

    def _forward(self, model, tokens: GroupTokens, rows_per_prompt: int, *, with_entropy: bool,
                 entropy_grad: bool = False, recompute_head: bool = False) -> TokenLogprobs:
        logp, entropy = forward_in_engine(
            model, response_logprobs, tokens.prompt_ids, tokens.prompt_mask, tokens.response_ids,
            tokens.response_mask, group_size=rows_per_prompt, temperature=self.temperature,
            chunk_tokens=self._cfg.trainer.logit_chunk_tokens, with_entropy=with_entropy, entropy_grad=entropy_grad,
            recompute_head=recompute_head)
        return TokenLogprobs(logp, entropy if with_entropy else None)

    @property
    def temperature(self) -> float:
        """Log-probs and entropy are taken under the sampling temperature (greedy rollouts: 1)."""
        return self._cfg.rollout.temperature or 1.0

    def logprobs(self, tokens: GroupTokens, rows_per_prompt: int, *, grad: bool, with_entropy: bool,
                 entropy_grad: bool = False) -> TokenLogprobs:
        """The policy's log-probs of `tokens`' responses (each prompt once for its `rows_per_prompt` rows). `grad`:
        the update's pass, through the engine (its hooks count the micro-batch), dropout on, the output layer
        recomputed in the backward per trainer.recompute_head; else without grad and without dropout (the old
        policy)."""
        if grad:
            return self._forward(self.engine, tokens, rows_per_prompt, with_entropy=with_entropy,
                                 entropy_grad=entropy_grad, recompute_head=self._cfg.trainer.recompute_head)
        with torch.no_grad(), no_dropout(self.module):
            return self._forward(self.module, tokens, rows_per_prompt, with_entropy=with_entropy)

    def reference_logprobs(self, tokens: GroupTokens, rows_per_prompt: int) -> torch.Tensor:
        """[rows, T] log-probs under the KL reference, the initial policy, without grad."""
        with torch.no_grad(), no_dropout(self.module), self._reference_model() as reference:
            return self._forward(reference, tokens, rows_per_prompt, with_entropy=False).logp

    def _reference_model(self) -> contextlib.AbstractContextManager:
        """The frozen copy where one was built, else (LoRA) the policy's own module with its adapters switched off,
        which is the initial policy (adapters start at B = 0)."""
        if self._reference is not None:
            return contextlib.nullcontext(self._reference)
        if not is_lora(self.module):
            raise RuntimeError("the KL term needs a reference model: this policy was built without one "
                               "(the algorithm's config asks for no KL term)")
        return _without_adapters(self.module)

    def backward(self, loss: torch.Tensor) -> None:
        """Back-propagate this rank's share of the global mean loss: DeepSpeed averages gradients over ranks, so it is
        scaled by the world size, and not again by gradient accumulation (the loss is already a share)."""
        self.engine.backward(loss * dist.world_size(), scale_wrt_gas=False)

    def step(self) -> None:
        """One optimizer update with the gradients accumulated since the last one."""
        self.engine.step()

    def set_lr(self, lr: float) -> None:
        """The learning rate of the following updates, on every parameter group (DeepSpeed's ZeRO optimizers wrap
        these same groups)."""
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def grad_norm(self) -> float:
        """The gradient norm of the last update (before clipping); 0 before any."""
        return float(self.engine.get_global_grad_norm() or 0.0)

    def lr(self) -> float:
        return float(self.engine.get_lr()[0])

    def save(self, root: Path, step: int, client_state: dict, *, keep_last: int, with_checksums: bool) -> None:
        """Checkpoint `step` under `root` on every rank (a collective; see tokenpo.trainer.checkpoint)."""
        checkpoint.save(self.engine, root, step, client_state, keep_last, self._cfg.model.lora.settings(),
                        with_checksums)

    def load(self, path: Path) -> dict:
        """Restore the engine (model, optimizer) and this rank's RNG states from checkpoint `path`; the client
        state saved with it."""
        return checkpoint.load(self.engine, path, self._cfg.model.lora.settings())

    def export(self, tokenizer, out: Path) -> None:
        """The final policy as a Hugging Face folder (LoRA: merged, and the adapter in out/adapter)."""
        export_hf(self.engine, tokenizer, out, self._cfg.deepspeed.stage)


@contextlib.contextmanager
def _without_adapters(module):
    with adapters_disabled(module):
        yield module

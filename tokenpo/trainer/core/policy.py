"""The trained model behind one interface: its DeepSpeed engine, LoRA adapters, the KL reference, checkpoint state and
export. The step calls `logprobs`, `reference_logprobs`, `backward`, `step`; weights leave it only through
`publish`; nothing outside this module needs to know whether the policy trains LoRA adapters, where its reference
lives, or whether ZeRO-3 partitions it.

LoRA (tokenpo.models.lora) changes four things of the policy, all of them here: no reference copy is built (the policy's own
module with its adapters off is the initial policy), checkpoints hold the trainable parameters only (the frozen base
is the model's own) and record the LoRA settings a resume must match, and the export writes the merged model and the
adapter.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from tokenpo import algorithms as alg
from tokenpo.deepspeed import dist
from tokenpo.deepspeed.engine import build_policy_engine, build_reference, gathered_for_generation, partitioned_loading
from tokenpo.deepspeed.export import zero3_16bit_state_dict
from tokenpo.models.loading import load_model
from tokenpo.models.logprobs import PassOptions, PassTokens, with_response_pass
from tokenpo.models.lora import adapters_disabled, save_merged_and_adapter
from tokenpo.models.modes import no_dropout
from tokenpo.models.published import Published, published
from tokenpo.trainer.core.batch import GroupTokens
from tokenpo.trainer.core.update_guard import UpdateGuard
from tokenpo.trainer.core.optim import build_optimizer

if TYPE_CHECKING:
    from tokenpo.config import TrainConfig


@dataclass(frozen=True)
class TokenLogprobs:
    """One forward's result over a micro-batch's rows."""

    logp: torch.Tensor  # [rows, T] log-probs of the response tokens under the rollout temperature
    entropy: torch.Tensor | None  # [rows, T] token entropy, when asked for


@dataclass(frozen=True)
class PolicySettings:
    """What the policy's passes and checkpoints read of the config, fixed at build()."""

    temperature: float  # log-probs and entropy under the sampling temperature (greedy rollouts: 1)
    chunk_tokens: int  # trainer.logit_chunk_tokens: output-layer rows computed at a time
    recompute_head: bool  # trainer.recompute_head: the update's output layer recomputed in the backward
    lora: dict | None  # model.lora settings (LoraConfig.settings()); None: full fine-tuning
    pack_sequences: bool = False  # trainer.pack_sequences: every pass's rows as one padding-free sequence
    partitioned: bool = False  # ZeRO-3: each process holds a shard of every parameter
    world_size: int = 1
    hold_updates: bool = False  # each step's last update waits for the step's health checks (`commit`)

    @classmethod
    def from_config(cls, cfg: TrainConfig, world_size: int = 1) -> PolicySettings:
        return cls(cfg.rollout.temperature or 1.0, cfg.trainer.logit_chunk_tokens, cfg.trainer.recompute_head,
                   cfg.model.lora.settings(), cfg.trainer.pack_sequences, cfg.deepspeed.partitioned, world_size,
                   cfg.trainer.health.holds_updates)

    @property
    def lockstep(self) -> bool:
        """The same decoder and output-layer calls on every rank: under ZeRO-3 on several processes each call gathers
        parameters with collectives."""
        return self.partitioned and self.world_size > 1

    def pass_options(self, *, with_entropy: bool, entropy_grad: bool = False,
                     recompute_head: bool = False) -> PassOptions:
        """A pass's options: these settings' and what the pass asks for."""
        return PassOptions(self.pack_sequences, self.lockstep, self.temperature, self.chunk_tokens, with_entropy,
                           entropy_grad, recompute_head)


class Policy:
    """The trained model: its DeepSpeed engine, LoRA adapters, the KL reference, checkpoint state and export."""

    def __init__(self, engine, optimizer: torch.optim.Optimizer | None, reference: torch.nn.Module | None,
                 device: torch.device, settings: PolicySettings) -> None:
        """`engine.module` and `reference` with the response pass as their forward (build() gives it them)."""
        self._engine = engine  # DeepSpeed's; its weights leave through `publish` only
        self._optimizer = optimizer  # the torch optimizer inside the engine (the learning rate is set on its groups)
        self.device = device
        self.settings = settings
        self._reference = reference  # the frozen copy; None without a KL term, or with LoRA (the adapters off)
        self._guard = UpdateGuard(optimizer)  # no non-finite update reaches the weights; health checks may hold one
        self._guard.hold = settings.hold_updates

    @property
    def module(self) -> torch.nn.Module:
        """The trained nn.Module (a PEFT model with LoRA), to inspect (parameter counts); weights leave through
        `publish`."""
        return self._engine.module

    @classmethod
    def build(cls, cfg: TrainConfig, world_size: int, device: torch.device) -> tuple[object, Policy]:
        """(tokenizer, policy): the model loaded (partitioned under ZeRO-3), the reference when the algorithm needs one
        (a frozen copy; with LoRA none: the policy's own module with its adapters off is the initial policy), the
        optimizer at step 1's learning rate, the engine. The caller seeds torch first (the weights of a LoRA adapter
        and a tiny model are drawn from it)."""
        settings = PolicySettings.from_config(cfg, world_size)
        sizes = dict(micro_batch_size=cfg.trainer.micro_batch_size, max_grad_norm=cfg.trainer.max_grad_norm,
                     world_size=world_size)
        partitioned = partitioned_loading(cfg.deepspeed, **sizes)
        tokenizer, model = load_model(cfg.model, cfg.seed, partitioned)
        # every pass is a call of the model's forward: the update's through the engine, the no-grad ones the module's
        with_response_pass(model)
        reference = None
        if alg.needs_reference(cfg.algorithm) and settings.lora is None:
            reference = build_reference(model, cfg.deepspeed, **sizes,
                                        load_initial=lambda: load_model(cfg.model, cfg.seed, partitioned)[1])
            # a copy has the pass already; under ZeRO-3 a second load has not
            with_response_pass(reference).to(device)
        optimizer = build_optimizer(model, cfg.trainer)
        engine = build_policy_engine(model, optimizer, cfg.deepspeed, **sizes)
        return tokenizer, cls(engine, optimizer, reference, device, settings)

    def publish(self, version: int) -> Published:
        """The only way weights leave the policy: version `version` (the policy after that many rollout steps'
        updates) for a generator, read when it loads it: the tensors in the base model's names, a LoRA policy's
        layers merged (W + scale·B·A), under ZeRO-3 gathered one module at a time so no rank holds a second full
        copy; or the live module for a generator in this process (under ZeRO-3 gathered for the `with`)."""
        self._guard.flush()  # an update held for the step's health checks is applied before its weights go out
        partitioned = self.settings.partitioned
        return published(self.module, version, partitioned=partitioned,
                         lend=lambda: gathered_for_generation(self._engine, partitioned))

    def _forward(self, model, tokens: GroupTokens, options: PassOptions, fed: PassTokens | None) -> TokenLogprobs:
        """`tokens`' response pass as `model`'s forward: the engine (which calls its module) or a module."""
        self._guard.flush()  # an update held for the step's health checks is applied before a pass reads the weights
        # the options by keyword: ZeRO-3's hooks look for tensors among a module's positional inputs, and warn about
        # a type they cannot look into
        logp, entropy = model(tokens.prompt_ids, tokens.prompt_mask, tokens.response_ids, tokens.response_mask,
                              prompt_index=tokens.prompt_index, response_pass=options, tokens=fed)
        return TokenLogprobs(logp, entropy)

    def logprobs(self, tokens: GroupTokens, *, grad: bool, with_entropy: bool, entropy_grad: bool = False,
                 fed: PassTokens | None = None) -> TokenLogprobs:
        """The policy's log-probs of `tokens`' responses (each prompt once for its rows, or packed per
        trainer.pack_sequences). `grad`: the update's pass, through the engine (its hooks count the micro-batch),
        dropout on, the output layer recomputed in the backward per trainer.recompute_head; else without grad and
        without dropout (the old policy). `fed` counts the token positions the decoder ran."""
        if grad:
            options = self.settings.pass_options(with_entropy=with_entropy, entropy_grad=entropy_grad,
                                                 recompute_head=self.settings.recompute_head)
            return self._forward(self._engine, tokens, options, fed)
        with torch.no_grad(), no_dropout(self.module):
            return self._forward(self.module, tokens, self.settings.pass_options(with_entropy=with_entropy), fed)

    def reference_logprobs(self, tokens: GroupTokens) -> torch.Tensor:
        """[rows, T] log-probs under the KL reference, the initial policy, without grad."""
        with torch.no_grad(), no_dropout(self.module), self._reference_model() as reference:
            return self._forward(reference, tokens, self.settings.pass_options(with_entropy=False), None).logp

    def _reference_model(self) -> contextlib.AbstractContextManager:
        """The frozen copy where one was built, else (LoRA) the policy's own module with its adapters switched off,
        which is the initial policy (adapters start at B = 0)."""
        if self._reference is not None:
            return contextlib.nullcontext(self._reference)
        if self.settings.lora is None:
            raise RuntimeError("the KL term needs a reference model: this policy was built for an algorithm without one")
        return _without_adapters(self.module)

    def backward(self, loss: torch.Tensor) -> None:
        """Back-propagate this rank's share of the global mean loss: DeepSpeed averages gradients over ranks, so it is
        scaled by the world size, and not again by gradient accumulation (the loss is already a share)."""
        self._guard.note_loss(loss)
        self._engine.backward(loss * dist.world_size(), scale_wrt_gas=False)

    def step(self) -> None:
        """One optimizer update with the gradients accumulated since the last one; never a non-finite one, and held
        until the step's health checks where one may skip it (tokenpo.trainer.core.update_guard.UpdateGuard)."""
        self._guard.step(self._engine)

    def commit(self, veto: bool) -> bool:
        """The update held for the step's health checks applied, or skipped (`veto`); whether one was held."""
        return self._guard.release(veto)

    def skipped_updates(self) -> tuple[int, int]:
        """(updates not applied, of them for a non-finite loss or gradient) since the last call."""
        return self._guard.take()

    def set_lr(self, lr: float) -> None:
        """The learning rate of the following updates, on every parameter group (DeepSpeed's ZeRO optimizers wrap
        these same groups)."""
        for group in self._optimizer.param_groups:
            group["lr"] = lr

    def grad_norm(self) -> float:
        """The gradient norm of the last update (before clipping); 0 before any."""
        return float(self._engine.get_global_grad_norm() or 0.0)

    def lr(self) -> float:
        return float(self._engine.get_lr()[0])

    @property
    def zero_stage(self) -> int:
        """The ZeRO stage DeepSpeed runs (a checkpoint records it: a resume must match it)."""
        return self._engine.zero_optimization_stage()

    @property
    def adapters(self) -> dict | None:
        """The LoRA settings it trains with (model.lora); None: full fine-tuning. A checkpoint records them."""
        return self.settings.lora

    def write_state(self, folder: Path, tag: str, client_state: dict) -> None:
        """This rank's share of the engine's state (model, optimizer; with LoRA the trainable parameters only: the
        frozen base is the model's own) with `client_state`, into `folder`/`tag` (a collective)."""
        frozen = {"exclude_frozen_parameters": True} if self.settings.lora else {}
        self._engine.save_checkpoint(str(folder), tag=tag, client_state=client_state, save_latest=False, **frozen)

    def read_state(self, folder: Path, tag: str) -> dict | None:
        """The engine's state back from `folder`/`tag` (model, optimizer; no LR scheduler: the learning rate follows
        from the rollout step); the client state saved with it, None where DeepSpeed could not load it."""
        frozen = {"load_module_strict": False} if self.settings.lora else {}  # the saved module lacks the frozen base
        load_path, client_state = self._engine.load_checkpoint(str(folder), tag=tag, load_optimizer_states=True,
                                                               load_lr_scheduler_states=False, **frozen)
        return None if load_path is None else client_state or {}

    def export(self, tokenizer, out: Path) -> None:
        """The final policy in Hugging Face format in `out` (AutoModelForCausalLM.from_pretrained loads it); a LoRA
        policy merged into its base weights there and as the PEFT adapter in out/adapter. Under ZeRO-3 every rank
        holds a shard: all ranks take part in consolidating the 16-bit weights, which rank 0 alone writes."""
        state = zero3_16bit_state_dict(self.module) if self.settings.partitioned else None
        if dist.is_main():
            if self.settings.lora:
                save_merged_and_adapter(self.module, out, state)
            else:
                self.module.save_pretrained(out, state_dict=state)
            tokenizer.save_pretrained(out)
        if dist.world_size() > 1:
            torch.distributed.barrier()


@contextlib.contextmanager
def _without_adapters(module):
    with adapters_disabled(module):
        yield module

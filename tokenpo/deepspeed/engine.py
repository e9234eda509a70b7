"""Wrap the policy (and, for ZeRO-3, the reference model) in DeepSpeed engines.

The DeepSpeed internals patched or read here are these, each for a reason its comment gives, each checked against the
installed DeepSpeed by tests/deepspeed/test_internals.py (which fails when DeepSpeed renames or changes one, and when
DeepSpeed starts doing itself what a patch does): `DeepSpeedEngine.clip_fp32_gradients` (_record_grad_norm),
`DeepSpeedEngine.module_state_dict` (_frozen_left_out_of_checkpoints), the `enable_backward_allreduce` flag
(build_policy_engine), `DeepSpeedEngine.forward` calling `self.module(...)` (the trainer's passes run as the module's
forward: tokenpo.models.logprobs.with_response_pass) and the parameters' `ds_active_sub_modules`
(gathered_for_generation). All hold in DeepSpeed 0.19.5 to 0.19.8 (read in their sources),
the range tokenpo.versions accepts (>=0.19.5,<0.20).
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable
from dataclasses import dataclass

from tokenpo.deepspeed import dist  # noqa: F401  (names the accelerator before DeepSpeed is imported)
from tokenpo.deepspeed.config import DeepSpeedConfig, engine_json

import deepspeed  # noqa: E402  (isort: skip)
import torch  # noqa: E402
from deepspeed.runtime.utils import clip_grad_norm_  # noqa: E402


def build_policy_engine(model, optimizer: torch.optim.Optimizer, ds: DeepSpeedConfig, *, micro_batch_size: int,
                        max_grad_norm: float, world_size: int):
    """The policy's engine around the caller's optimizer; no LR scheduler: the caller sets the learning rate
    on `optimizer` (DeepSpeed would advance a scheduler once per optimizer update)."""
    config = engine_json(ds, micro_batch_size=micro_batch_size, world_size=world_size, max_grad_norm=max_grad_norm)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    _frozen_left_out_of_checkpoints(engine)
    if ds.engine_stage == 0:
        _record_grad_norm(engine)
        if world_size == 1:
            # one process has nothing to reduce, but stage 0 would still flatten every gradient into a buffer and
            # copy it back (0.5 s a step for 135M parameters on CPU, docs/performance.md); ZeRO 1-3 keep the
            # path, their optimizers do their gradient bookkeeping in it. No config key says it: DeepSpeed sets
            # this engine attribute itself only without a process group, and its backward and step read it
            engine.enable_backward_allreduce = False
    return engine


def _record_grad_norm(engine) -> None:
    """Without ZeRO (and in fp32), DeepSpeed's step clips the gradients in `clip_fp32_gradients` but drops the norm it
    computes there, so `get_global_grad_norm()` is None; the instance's method stands in for it, the same clipping
    with the norm kept for `grad_norm` (no public call gives that norm after the step has zeroed the gradients)."""

    def clip_and_record():
        engine._global_grad_norm = float(clip_grad_norm_(parameters=engine.module.parameters(),
                                                         max_norm=engine.gradient_clipping(), mpu=engine.mpu))

    engine.clip_fp32_gradients = clip_and_record


def _frozen_left_out_of_checkpoints(engine) -> None:
    """`save_checkpoint(exclude_frozen_parameters=True)` (a policy with a frozen base) leaves out every frozen tensor.
    DeepSpeed's `module_state_dict` drops frozen parameters by their first name only (`named_parameters()` lists a
    shared tensor once), so a frozen tensor under a second name stayed in the checkpoint: the output layer tied to the
    embeddings, a vocabulary-sized matrix. `save_checkpoint` reads the state through the engine's attribute, which
    the instance's method replaces."""
    module_state_dict = engine.module_state_dict

    def trainable_only(*args, exclude_frozen_parameters: bool = False, **kwargs):
        state = module_state_dict(*args, exclude_frozen_parameters=exclude_frozen_parameters, **kwargs)
        if exclude_frozen_parameters:
            trainable = {name for name, p in engine.module.named_parameters(remove_duplicate=False) if p.requires_grad}
            for name in [name for name in state if name not in trainable]:
                del state[name]
        return state

    engine.module_state_dict = trainable_only


@dataclass(frozen=True)
class PartitionedLoading:
    """How `load_model` builds a model under ZeRO-3: partitioned over the ranks as it loads (DeepSpeed's `zero.Init`),
    instead of every rank loading the whole model (and a whole copy for the reference) that the engine then
    partitions. `config`: the engine's DeepSpeed JSON."""

    config: dict

    @contextlib.contextmanager
    def pretrained(self):
        """Within, transformers' `from_pretrained` builds the model inside `deepspeed.zero.Init` and only rank 0 reads
        the checkpoint's tensors (the others read its shapes), module by module into the partitions: transformers'
        HfDeepSpeedConfig route, which TRL and accelerate take under ZeRO-3. Scoped to the load: while it is set,
        transformers' `generate` would also switch to its own ZeRO-3 mode (synced_gpus)."""
        from transformers.integrations import HfDeepSpeedConfig
        from transformers.integrations.deepspeed import unset_hf_deepspeed_config

        # transformers keeps only a weak reference to it
        hold = HfDeepSpeedConfig(self.config)
        try:
            yield
        finally:
            del hold
            unset_hf_deepspeed_config()

    def partition(self, module: torch.nn.Module) -> torch.nn.Module:
        """`module`, built whole on every rank, partitioned in place in the dtype the engine trains in (the engine
        casts only models it partitions itself). For the tiny test model, whose seeded weights must not depend on
        the stage: transformers' ZeRO-3 construction initialises weights in another order."""
        in_training_dtype(module, self.config["bf16"]["enabled"])
        deepspeed.zero.Init(module=module, config_dict_or_path=self.config, mem_efficient_linear=False)
        return module


def partitioned_loading(ds: DeepSpeedConfig, *, micro_batch_size: int, max_grad_norm: float,
                        world_size: int) -> PartitionedLoading | None:
    """Under ZeRO-3 how to load models partitioned; None at stages 0-2, which load whole models."""
    if not ds.partitioned:
        return None
    return PartitionedLoading(engine_json(ds, micro_batch_size=micro_batch_size, world_size=world_size,
                                          max_grad_norm=max_grad_norm))


def in_training_dtype(module: torch.nn.Module, bf16: bool) -> torch.nn.Module:
    """`module` with its parameters cast as DeepSpeed casts the policy's when it builds the engine: to bf16 under
    deepspeed.precision=bf16, buffers left alone (RoPE's inv_freq stays fp32)."""
    if bf16:
        for param in module.parameters():
            param.data = param.data.to(torch.bfloat16)
    return module


def build_reference(model, ds: DeepSpeedConfig, *, load_initial: Callable[[], torch.nn.Module], micro_batch_size: int,
                    max_grad_norm: float, world_size: int):
    """A frozen copy of the initial policy in the policy's training dtype (an fp32 reference beside a bf16 policy
    would make kl/ref nonzero at step 0); under ZeRO-3 loaded again, partitioned (`load_initial`: a copy of a
    partitioned model holds no weights), and run by its own engine."""
    if not ds.partitioned:
        reference = in_training_dtype(copy.deepcopy(model), ds.precision == "bf16")
        return reference.eval().requires_grad_(False)
    # as TRL's GRPOTrainer does under ZeRO-3: the reference is a second from_pretrained, not a copy of the policy
    reference = load_initial().eval().requires_grad_(False)
    config = engine_json(ds, micro_batch_size=micro_batch_size, world_size=world_size, max_grad_norm=max_grad_norm)
    config["zero_optimization"].pop("offload_optimizer", None)
    engine, *_ = deepspeed.initialize(model=reference, config=config)
    return engine.module


@contextlib.contextmanager
def gathered_for_generation(engine, partitioned: bool):
    """The engine's module for a whole generation call: under ZeRO-3 with its full parameters, gathered once.

    ZeRO-3's per-module hooks would otherwise release each layer after its forward and gather it again at every
    decoded token; DeepSpeed's `unwrap_model_for_generation` gathers the parameters and lifts the hooks for the body,
    and puts the hooks back after (tests/deepspeed/test_internals.py); not after an error inside, which ends the run
    (tokenpo.trainer.core.worst_case.out_of_memory_reported re-raises). The full model must fit on one device for the
    duration (the parameters are re-partitioned on exit).
    """
    if not partitioned:
        yield engine.module
        return
    from deepspeed.runtime.zero import unwrap_model_for_generation

    with unwrap_model_for_generation(engine):
        # DeepSpeed refuses to re-partition a parameter that a module left marked in use (ds_active_sub_modules: "Cannot
        # free a ZeRO-3 parameter while it is still active in submodules") when the gather ends; with the hooks lifted
        # no module releases it, so the marks go (as TRL's remove_hooks does, huggingface/trl#1617)
        for param in engine.module.parameters():
            param.ds_active_sub_modules.clear()
        yield engine.module

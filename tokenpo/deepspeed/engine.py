"""Wrap the policy (and, for ZeRO-3, the reference model) in DeepSpeed engines."""

from __future__ import annotations

import contextlib
import copy
import functools

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
    if ds.stage == 0:
        _record_grad_norm(engine)
        if world_size == 1:
            # one process has nothing to reduce, but stage 0 would still flatten every gradient into a buffer and
            # copy it back (0.5 s a step for 135M parameters on CPU, docs/performance.md); ZeRO 1-3 keep the
            # path, their optimizers do their gradient bookkeeping in it
            engine.enable_backward_allreduce = False
    return engine


def _record_grad_norm(engine) -> None:
    """Without ZeRO, DeepSpeed clips fp32 gradients but drops the norm; keep it for `grad_norm`."""

    def clip_and_record():
        engine._global_grad_norm = float(clip_grad_norm_(parameters=engine.module.parameters(),
                                                         max_norm=engine.gradient_clipping(), mpu=engine.mpu))

    engine.clip_fp32_gradients = clip_and_record


def _frozen_left_out_of_checkpoints(engine) -> None:
    """`save_checkpoint(exclude_frozen_parameters=True)` (LoRA runs) leaves out every frozen tensor. DeepSpeed drops
    frozen parameters by their first name only, so a frozen tensor under a second name stayed in the checkpoint: the
    output layer tied to the embeddings, a vocabulary-sized matrix."""
    module_state_dict = engine.module_state_dict

    def trainable_only(*args, exclude_frozen_parameters: bool = False, **kwargs):
        state = module_state_dict(*args, exclude_frozen_parameters=exclude_frozen_parameters, **kwargs)
        if exclude_frozen_parameters:
            trainable = {name for name, p in engine.module.named_parameters(remove_duplicate=False) if p.requires_grad}
            for name in [name for name in state if name not in trainable]:
                del state[name]
        return state

    engine.module_state_dict = trainable_only


def forward_in_engine(model, fn, *args, **kwargs):
    """`fn(module, *args, **kwargs)`; for a DeepSpeed engine, run as its module's forward inside `engine(...)`.

    The trainer's differentiable pass calls the decoder and chunks of the output layer itself (vocabulary-sized
    logits never exist for all tokens at once) instead of the model's forward. DeepSpeed keeps per-micro-batch
    state in `DeepSpeedEngine.forward` and the hooks it puts on the module and on the outputs: ZeRO's backward
    bookkeeping and, under ZeRO-3, the micro-step counter without which a micro-batch's gradients overwrite
    the previous ones instead of adding up. So `fn` stands in for the module's forward for one call.
    """
    if not isinstance(model, deepspeed.DeepSpeedEngine):
        return fn(model, *args, **kwargs)
    module = model.module
    # an instance attribute shadows the class's forward; nn.Module.__call__ still runs every hook around it
    module.forward = functools.partial(fn, module)
    try:
        return model(*args, **kwargs)
    finally:
        del module.forward


def build_reference(model, ds: DeepSpeedConfig, *, micro_batch_size: int, max_grad_norm: float, world_size: int):
    """A frozen copy of the initial policy; sharded by its own ZeRO-3 engine when the policy is."""
    reference = copy.deepcopy(model).eval()
    reference.requires_grad_(False)
    if ds.stage != 3:
        return reference
    config = engine_json(ds, micro_batch_size=micro_batch_size, world_size=world_size, max_grad_norm=max_grad_norm)
    config["zero_optimization"].pop("offload_optimizer", None)
    engine, *_ = deepspeed.initialize(model=reference, config=config)
    return engine.module


@contextlib.contextmanager
def gathered_for_generation(engine, ds: DeepSpeedConfig):
    """Under ZeRO-3, gather the policy's full parameters once for a whole generation call.

    ZeRO-3's per-module hooks would otherwise release each layer after its forward and gather it again at every
    decoded token; they are lifted while the parameters are gathered and put back afterwards. The full model
    must fit on one device for the duration (the parameters are re-partitioned on exit).
    """
    if ds.stage != 3:
        yield
        return
    offload = engine.optimizer.parameter_offload
    with deepspeed.zero.GatheredParameters(list(engine.module.parameters())):
        for param in engine.module.parameters():
            param.ds_active_sub_modules.clear()
        for hook in offload.forward_hooks + offload.backward_hooks:
            hook.remove()
        offload.forward_hooks, offload.backward_hooks = [], []
        try:
            yield
        finally:
            offload._register_deepspeed_module(offload.module)

"""The DeepSpeed internals tokenpo relies on (tokenpo.deepspeed.engine), each checked against the installed DeepSpeed
(tokenpo.versions: >=0.19.5,<0.20): every test here fails when DeepSpeed renames, drops or changes what tokenpo patches
or reads, and the tests of DeepSpeed's own behaviour fail when it starts doing what the patch does (then the patch
can go). One process (gloo), tiny models."""

from __future__ import annotations

from copy import deepcopy

import deepspeed
import pytest
import torch
from deepspeed import DeepSpeedEngine
from support.runs import in_process_training

from tokenpo.deepspeed import dist
from tokenpo.deepspeed.config import DeepSpeedConfig, engine_json
from tokenpo.deepspeed.engine import build_policy_engine, gathered_for_generation
from tokenpo.models.config import LoraConfig, ModelConfig, TinyConfig
from tokenpo.models.loading import build_tiny_model
from tokenpo.models.logprobs import PassOptions, response_logprobs, with_response_pass
from tokenpo.models.lora import wrap_lora

TINY = ModelConfig(name="tiny", source="tiny", tiny=TinyConfig(hidden_size=32, num_layers=2, num_heads=4,
                                                                intermediate_size=64))
VOCAB = 97
# gradient clipping on, at a norm the first gradient of the tiny model exceeds
MAX_GRAD_NORM = 1e-3


@pytest.fixture(autouse=True)
def one_process():
    with in_process_training():
        dist.init_distributed("gloo")
        yield


def tiny(lora: bool = False) -> torch.nn.Module:
    """The tiny Llama (output layer tied to the embeddings); with LoRA adapters, its base frozen."""
    model = build_tiny_model(TINY, VOCAB, seed=0)
    return wrap_lora(model, LoraConfig(rank=2)) if lora else model


def ours(model, stage: int = 0) -> DeepSpeedEngine:
    """tokenpo's policy engine (build_policy_engine, with its patches)."""
    return build_policy_engine(model, torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3),
                               DeepSpeedConfig(stage=stage), micro_batch_size=2, max_grad_norm=MAX_GRAD_NORM,
                               world_size=1)


def deepspeeds_own(model, stage: int = 0) -> DeepSpeedEngine:
    """The same engine straight from deepspeed.initialize, unpatched."""
    config = engine_json(DeepSpeedConfig(stage=stage), micro_batch_size=2, world_size=1, max_grad_norm=MAX_GRAD_NORM)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    return engine


TOKENS = torch.tensor([[1, 5, 9, 13, 17, 21], [2, 6, 10, 14, 18, 22]])


def loss_of(model) -> torch.Tensor:
    return model(input_ids=TOKENS, labels=TOKENS).loss


def gradient_norm(module) -> float:
    return float(torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in module.parameters()
                                                       if p.grad is not None])))


# -- _record_grad_norm: stage 0 patches DeepSpeedEngine.clip_fp32_gradients to keep the norm it computes

def test_stage_0_reports_the_norm_it_clipped_by():
    engine = ours(tiny())
    engine.backward(loss_of(engine))
    expected = gradient_norm(engine.module)
    assert expected > MAX_GRAD_NORM  # so clipping acts, and the norm is the one before clipping
    engine.step()
    assert engine.get_global_grad_norm() == pytest.approx(expected, rel=1e-5)


def test_deepspeed_itself_clips_at_stage_0_through_clip_fp32_gradients_and_drops_the_norm():
    assert "clip_fp32_gradients" in vars(DeepSpeedEngine)  # the method the patch stands in for
    engine = deepspeeds_own(tiny())
    calls = []
    clip = engine.clip_fp32_gradients
    engine.clip_fp32_gradients = lambda: calls.append(1) or clip()
    engine.backward(loss_of(engine))
    engine.step()
    assert calls == [1]  # called by the step: the patch is reached
    # no norm: the patch is still needed (drop it once DeepSpeed reports one here)
    assert engine.get_global_grad_norm() is None


# -- _frozen_left_out_of_checkpoints: patches DeepSpeedEngine.module_state_dict for the frozen tied output layer

def frozen_names(module) -> set[str]:
    return {name for name, p in module.named_parameters(remove_duplicate=False) if not p.requires_grad}


def test_a_lora_checkpoint_holds_no_frozen_tensor_under_any_name(tmp_path):
    engine = ours(tiny(lora=True))
    state = engine.module_state_dict(exclude_frozen_parameters=True)
    assert state and not set(state) & frozen_names(engine.module)
    # save_checkpoint reads the state through the engine's own attribute (the patched one)
    engine.save_checkpoint(str(tmp_path), tag="state", exclude_frozen_parameters=True)
    [model_states] = (tmp_path / "state").glob("mp_rank_*_model_states.pt")
    saved = torch.load(model_states, weights_only=False)["module"]
    assert set(saved) == set(state)


def test_deepspeed_itself_keeps_the_tied_output_layer_of_a_frozen_base():
    engine = deepspeeds_own(tiny(lora=True))
    state = DeepSpeedEngine.module_state_dict(engine, exclude_frozen_parameters=True)
    left = set(state) & frozen_names(engine.module)
    # DeepSpeed drops frozen parameters by their first name only: the patch is still needed (drop it once it is not)
    assert left == {"base_model.model.lm_head.weight"}


# -- build_policy_engine: one process at stage 0 sets enable_backward_allreduce = False

def allreduce_calls(engine) -> int:
    calls = []
    reduce = engine.allreduce_gradients
    engine.allreduce_gradients = lambda *args, **kwargs: calls.append(1) or reduce(*args, **kwargs)
    engine.backward(loss_of(engine), scale_wrt_gas=False)
    engine.step()
    return len(calls)


def test_one_process_at_stage_0_reduces_no_gradients():
    engine = ours(tiny())
    assert engine.enable_backward_allreduce is False
    assert allreduce_calls(engine) == 0


def test_deepspeed_itself_reduces_the_gradients_of_one_process_unless_told_not_to():
    assert allreduce_calls(deepspeeds_own(tiny())) >= 1  # the work the flag saves
    engine = deepspeeds_own(tiny())
    engine.enable_backward_allreduce = False  # the public attribute DeepSpeed's backward and step read
    assert allreduce_calls(engine) == 0


# -- the trainer's passes as the module's forward (with_response_pass): DeepSpeedEngine.forward calls self.module(...)

RESPONSES = torch.tensor([[3, 7, 11, 0], [4, 8, 0, 0]])
RESPONSE_MASK = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]])


def response_pass(model, options: PassOptions = PassOptions(with_entropy=False)) -> torch.Tensor:
    """The log-probs of RESPONSES after TOKENS through `model` (an engine or a module), as the trainer calls it."""
    logp, _ = model(TOKENS, torch.ones_like(TOKENS), RESPONSES, RESPONSE_MASK, response_pass=options)
    return logp


def test_the_response_pass_runs_as_the_modules_forward_inside_the_engine():
    engine = ours(with_response_pass(tiny()))
    hooks = []
    engine.module.register_forward_pre_hook(lambda module, args: hooks.append(1))
    logp = response_pass(engine)
    assert hooks == [1] and logp.requires_grad
    direct, _ = response_logprobs(engine.module, TOKENS, torch.ones_like(TOKENS), RESPONSES, RESPONSE_MASK,
                                  options=PassOptions(with_entropy=False))
    assert torch.equal(logp, direct)
    assert loss_of(engine).requires_grad  # any other call: the model class's forward


def test_under_zero_3_micro_batches_through_the_engine_accumulate():
    """Why the update's pass runs through the engine: DeepSpeedEngine.forward counts the micro-step (ZeRO-3's
    micro_step_id), so the second micro-batch's gradients add to the first one's instead of replacing them; calling
    the module directly would not count it."""
    engine = ours(with_response_pass(tiny()), stage=3)
    steps = []
    for _ in range(2):
        engine.backward(response_pass(engine).sum(), scale_wrt_gas=False)
        steps.append(engine.optimizer.micro_step_id)
    assert steps == [0, 1]
    loss_of(engine.module).backward()  # the module alone: DeepSpeed's forward did not run
    assert engine.optimizer.micro_step_id == 1


def test_under_zero_3_passes_without_grad_keep_the_trace_prefetch_follows():
    """The no-grad passes call the module: its pre-forward hook restarts ZeRO-3's trace of the module order at each
    pass, so that the trace, once recorded, stays complete (a pass that skipped it would run on from the previous
    pass's position, invalidate the trace and leave DeepSpeed prefetching nothing)."""
    engine = ours(with_response_pass(tiny()), stage=3)
    coordinator = engine.optimizer.parameter_offload.get_param_coordinator()
    with torch.no_grad():
        for _ in range(3):  # recorded by the first, complete from the second on
            response_pass(engine.module)
    assert coordinator.is_complete_trace()


def test_the_response_pass_is_installed_once_and_follows_a_deep_copy():
    model = with_response_pass(tiny())
    assert with_response_pass(model) is model  # again: a no-op
    copy = with_response_pass(deepcopy(model))  # the KL reference: a copy runs its own weights
    with torch.no_grad():
        for p in copy.parameters():
            p.zero_()
        assert not torch.equal(response_pass(copy), response_pass(model))


# -- gathered_for_generation: under ZeRO-3 the parameters whole and the per-module hooks off for a generation call

def test_generation_under_zero_3_sees_the_whole_model_and_training_goes_on_after():
    engine = ours(tiny(), stage=3)
    engine.backward(loss_of(engine), scale_wrt_gas=False)
    engine.step()
    offload = engine.optimizer.parameter_offload
    hooks = len(offload.forward_hooks), len(offload.backward_hooks)
    assert min(hooks) > 0
    with gathered_for_generation(engine, partitioned=True):
        assert all(p.numel() == p.ds_numel for p in engine.module.parameters())  # whole
        assert (offload.forward_hooks, offload.backward_hooks) == ([], [])
        with torch.no_grad():
            logits = engine.module(input_ids=TOKENS).logits
    assert logits.shape == (*TOKENS.shape, VOCAB)
    assert (len(offload.forward_hooks), len(offload.backward_hooks)) == hooks  # put back
    assert any(p.numel() < p.ds_numel for p in engine.module.parameters())  # partitioned again
    engine.backward(loss_of(engine), scale_wrt_gas=False)
    engine.step()
    assert engine.get_global_grad_norm() > 0


def partitioned_parameter(engine) -> torch.nn.Parameter:
    return next(p for p in engine.module.parameters() if p.numel() < p.ds_numel)


def test_generation_under_zero_3_clears_what_a_module_left_marked_in_use():
    engine = ours(tiny(), stage=3)
    partitioned_parameter(engine).ds_active_sub_modules.add(10**6)  # as a module whose release never came
    with gathered_for_generation(engine, partitioned=True):
        pass
    assert partitioned_parameter(engine).ds_active_sub_modules == set()


def test_deepspeed_itself_refuses_to_partition_a_parameter_marked_in_use():
    from deepspeed.runtime.zero import unwrap_model_for_generation

    engine = ours(tiny(), stage=3)
    partitioned_parameter(engine).ds_active_sub_modules.add(10**6)
    # the clearing in gathered_for_generation is still needed (drop it once DeepSpeed's own context does it)
    with pytest.raises(RuntimeError, match="still active in submodules"):
        with unwrap_model_for_generation(engine):
            pass

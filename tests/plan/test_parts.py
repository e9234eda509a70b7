"""Closed-form parts of the memory plan, in exact bytes: parameters (against the model transformers builds),
weights, gradients, optimizer states and master weights by ZeRO stage, precision and world size."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from tokenpo.plan import parts as P
from tokenpo.plan.architecture import SHIPPED_CONFIGS, Architecture, architecture_from_config, num_parameters

SHIPPED = sorted(SHIPPED_CONFIGS.glob("*.json"))


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_parameter_count_is_the_models_own(path):
    config = json.loads(path.read_text())
    hf_config = AutoConfig.for_model(**config)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config)
    assert num_parameters(architecture_from_config(config, str(path))) == sum(p.numel() for p in model.parameters())


def test_published_parameter_counts():
    counts = {p.stem: num_parameters(architecture_from_config(json.loads(p.read_text()), p.name)) for p in SHIPPED}
    assert counts["qwen2_5_7b"] == counts["qwen2_5_math_7b"] == 7_615_616_512
    assert counts["smollm2_135m"] == 134_515_008
    assert counts["qwen2_5_math_1_5b"] == 1_543_714_304
    assert counts["qwen2_5_32b"] == 32_763_876_352


def test_a_config_without_a_needed_key_is_one_line():
    with pytest.raises(Exception, match=r"^x.json: config.json has no 'hidden_size'"):
        architecture_from_config({"num_attention_heads": 2}, "x.json")


PSI = 1_000_003  # not a multiple of the world size: ZeRO pads partitions to ceil(PSI / world)


@pytest.mark.parametrize("stage, world, expected", [
    (0, 4, PSI * 2), (1, 4, PSI * 2), (2, 4, PSI * 2), (3, 4, 250_001 * 2), (3, 1, PSI * 2),
])
def test_policy_weights_bf16(stage, world, expected):
    assert P.policy_weights(PSI, 2, stage, world, offload_param=False).bytes == expected


def test_offloaded_parameters_leave_the_device():
    part = P.policy_weights(PSI, 2, 3, 4, offload_param=True)
    assert (part.bytes, part.host_bytes) == (0, 250_001 * 2)


@pytest.mark.parametrize("stage, world, bucket, expected", [
    (0, 8, 0, PSI * 4), (1, 8, 0, PSI * 4), (2, 8, 1000, (125_001 + 1000) * 4), (3, 8, 1000, (125_001 + 1000) * 4),
])
def test_gradients_fp32(stage, world, bucket, expected):
    assert P.gradients(PSI, 4, stage, world, bucket).bytes == expected


@pytest.mark.parametrize("stage, world, expected", [(0, 8, 8 * PSI), (1, 8, 8 * 125_001), (3, 2, 8 * 500_002)])
def test_adam_states_are_two_fp32_tensors_sharded_from_zero_1(stage, world, expected):
    assert P.optimizer_states(PSI, stage, world, offload_optimizer=False).bytes == expected
    offloaded = P.optimizer_states(PSI, stage, world, offload_optimizer=True)
    assert (offloaded.bytes, offloaded.host_bytes) == (0, expected)


@pytest.mark.parametrize("stage, precision, world, expected", [
    (0, "fp32", 4, 0),  # torch AdamW on the fp32 parameters
    (0, "bf16", 4, 8 * PSI),  # DeepSpeed's bf16 wrapper: full fp32 copy + fp32 gradient
    (1, "fp32", 4, 8 * 250_001),  # ZeRO's fp32 partition exists in fp32 training too
    (2, "bf16", 4, 8 * 250_001),
    (3, "bf16", 1, 8 * PSI),
])
def test_master_weights(stage, precision, world, expected):
    assert P.master_weights(PSI, stage, world, precision, offload_optimizer=False).bytes == expected


def test_seven_b_on_eight_gpus_zero_2_bf16_is_the_zero_paper_arithmetic():
    # ZeRO paper (Rajbhandari et al. 2020): 2Ψ weights + (2 + 12)Ψ / N for ZeRO-2 with mixed-precision Adam
    psi, world = 7_615_616_512, 8
    total = (P.policy_weights(psi, 2, 2, world, False).bytes + P.gradients(psi, 2, 2, world, 0).bytes
             + P.optimizer_states(psi, 2, world, False).bytes + P.master_weights(psi, 2, world, "bf16", False).bytes)
    # the fp32 gradient of the master partition at the step: 4 more bytes per parameter per rank
    assert total == 2 * psi + (2 + 12 + 4) * psi // world


def test_reference_is_none_without_kl_and_with_lora():
    assert P.reference_weights(PSI, 2, 0, 1, needed=False, lora=False).bytes == 0
    assert P.reference_weights(PSI, 2, 0, 1, needed=True, lora=True).bytes == 0
    assert P.reference_weights(PSI, 2, 3, 4, needed=True, lora=False).bytes == 250_001 * 2


ARCH = Architecture(vocab_size=1000, hidden_size=64, num_layers=3, num_heads=4, num_kv_heads=2, head_dim=16,
                    intermediate_size=128, tie_word_embeddings=True, qkv_bias=False, max_position_embeddings=512,
                    context_length=512)


def test_hf_kv_cache_holds_every_row_at_prompt_plus_response_length():
    part = P.hf_rollout(ARCH, rows=6, prompt_tokens=10, new_tokens=20, elem=2)
    # keys + values x layers x kv width x rows x tokens x bytes, then fp32 logits, softmax, float64 cdf per row
    assert part.bytes == 2 * 3 * 32 * 6 * 30 * 2 + 6 * 1000 * 16


def test_vllm_takes_its_kv_cache_size_or_its_budget_and_never_less_than_one_sequence():
    weights, one_sequence = PSI * 2, 2**20
    assert P.vllm_rollout(weights, 2**30, None, one_sequence, asleep=False).bytes == weights + 2**30
    assert P.vllm_rollout(weights, None, 40 * 2**30, one_sequence, asleep=True).bytes == 40 * 2**30
    # a budget below its weights + one sequence's KV cache: the plan counts what vLLM needs to start
    assert P.vllm_rollout(weights, None, 2**10, one_sequence, asleep=True).bytes == weights + one_sequence
    assert P.vllm_rollout(weights, None, None, one_sequence, asleep=True).bytes == weights + one_sequence
    assert P.vllm_rollout(weights, 2**30, None, one_sequence, asleep=True).phase == P.GENERATION
    assert P.vllm_rollout(weights, 2**30, None, one_sequence, asleep=False).phase == P.ALWAYS


def test_vllms_budget_is_what_the_other_parts_leave_at_its_phase():
    others = [P.Part("a", 10, P.ALWAYS), P.Part("g", 5, P.GENERATION), P.Part("u", 30, P.UPDATE)]
    assert P.vllm_budget(others, 100, asleep=True) == 100 - 10 - 5  # the update's memory is free while it generates
    assert P.vllm_budget(others, 100, asleep=False) == 100 - 10 - 30  # held beside the update


def test_zero3_gather_is_bounded_by_max_live_parameters_and_the_other_ranks_shares():
    gathered = P.zero3_gather(PSI, 2, 3, 4, prefetch_bucket=100, max_live=1000, gathers_for_generation=True)
    assert [part.bytes for part in gathered] == [1100 * 2, (PSI - 250_001) * 2]
    assert P.zero3_gather(PSI, 2, 2, 4, 100, 1000, True) == []


def test_checkpointing_keeps_less_than_every_layer():
    full = P.activations(ARCH, rows=8, groups=2, prompt_tokens=100, new_tokens=200, elem=2, checkpointing=False)
    ckpt = P.activations(ARCH, rows=8, groups=2, prompt_tokens=100, new_tokens=200, elem=2, checkpointing=True)
    assert 0 < ckpt.bytes < full.bytes


def test_head_recompute_keeps_one_chunk():
    kept = P.head_chunks(ARCH, response_tokens=4096, chunk_tokens=512, recompute=False, entropy_grad=False)
    recomputed = P.head_chunks(ARCH, response_tokens=4096, chunk_tokens=512, recompute=True, entropy_grad=False)
    assert recomputed.bytes == 4 * 512 * 1000 * 4  # four chunk x vocabulary fp32 tensors
    assert kept.bytes == 3 * 512 * 1000 * 4 + 4096 * 1000 * 4  # three, and every token's fp32 logits


def test_zero0_gradients_replace_the_activations_during_one_backward():
    # large activations: only the output layer's gradient is written beside them
    assert P.gradients_in_backward(1000, 4, output_layer=100, activations_and_head=10**6).bytes == 100
    # small ones: after the backward, the gradients and DeepSpeed's flat all-reduce copy of them
    assert P.gradients_in_backward(1000, 4, output_layer=100, activations_and_head=500).bytes == 2 * 1000 * 4 - 500
    big = 2 * P.ALLREDUCE_BUCKET
    assert P.gradients_in_backward(big, 2, 0, 0).bytes == (big + P.ALLREDUCE_BUCKET) * 2


def test_gradients_accumulated_over_micro_batches_sit_beside_the_activations():
    from tokenpo.plan.cli import compose_train_config
    from tokenpo.plan.memory import build_plan

    # 8 prompts x 8 responses in micro-batches of 32: two backward passes per optimizer step
    plan = build_plan(compose_train_config(["model=tiny", "rollout.group_size=8"]), 1, prompt_tokens=40, device="cpu")
    assert plan.shapes.micro_batches == 2
    assert next(part.bytes for part in plan.parts if part.name == "gradients") == 4 * plan.params


def test_a_token_budget_sets_the_largest_micro_batch_and_packing_its_activations():
    from tokenpo.plan.cli import compose_train_config
    from tokenpo.plan.memory import build_plan, run_shapes

    cfg = compose_train_config(["model=tiny", "rollout.group_size=8", "rollout.max_new_tokens=200",
                                "trainer.micro_batch_tokens=1000"])
    shapes = run_shapes(cfg, 1, 40)
    # 1000 tokens hold 4 rows of 40 + 200 (from one group); the update's 64 rows take 16 passes
    assert (shapes.micro_rows, shapes.micro_groups, shapes.micro_batches) == (4, 1, 16)
    shared = build_plan(cfg, 1, prompt_tokens=40, device="cpu")
    packed_cfg = compose_train_config(["model=tiny", "rollout.group_size=8", "rollout.max_new_tokens=200",
                                       "trainer.micro_batch_tokens=1000", "trainer.pack_sequences=true"])
    packed = build_plan(packed_cfg, 1, prompt_tokens=40, device="cpu")
    shared_part, packed_part = (next(p for p in plan.parts if p.name == "activations") for plan in (shared, packed))
    # sdpa: the prompt once (40) and the 4 responses but their last tokens (4 x 199)
    assert packed_part.note.startswith("packed (shared): 4 rows in one sequence of 836 tokens")
    assert packed_part.bytes > shared_part.bytes  # the row-by-row attention's copies and the pass's bool mask
    # halving the budget is the listed change for a budget that does not fit
    from tokenpo.plan.memory import smaller_micro_batches

    assert [o.change for o in smaller_micro_batches(cfg)] == ["trainer.micro_batch_tokens=500",
                                                              "trainer.micro_batch_tokens=250"]


def test_a_generator_ahead_of_the_update_is_planned_in_host_memory():
    from tokenpo.plan.cli import compose_train_config
    from tokenpo.plan.memory import build_plan

    cfg = compose_train_config(["model=tiny", "rollout.async.max_staleness=1"])
    plan = build_plan(cfg, 1, prompt_tokens=40, device="cpu")
    part = next(p for p in plan.parts if p.name == "generator process (rollout.async)")
    weights = plan.params * 4
    assert part.bytes == 0 and part.host_bytes > 2 * weights  # its model, the shared copy, its KV cache
    in_turn = build_plan(compose_train_config(["model=tiny"]), 1, prompt_tokens=40, device="cpu")
    assert plan.total_bytes == in_turn.total_bytes and plan.host_bytes == in_turn.host_bytes + part.host_bytes


def test_vllm_ahead_is_planned_awake_with_only_the_shared_copy_in_the_generator_process():
    from tokenpo.plan.cli import compose_train_config
    from tokenpo.plan.memory import build_plan
    from tokenpo.plan.parts import ALWAYS, GENERATION, VLLM_PART

    def plan_of(*overrides):
        return build_plan(compose_train_config(["model=tiny", "rollout=vllm", *overrides]), 1, 80 * 2**30,
                          prompt_tokens=40, device="cuda")

    ahead, in_turn = plan_of("rollout.async.max_staleness=1"), plan_of()
    part = next(p for p in ahead.parts if p.name == "generator process (rollout.async)")
    assert part.bytes == 0 and part.host_bytes == ahead.params * 4  # the shared copy: vLLM's weights are its part
    # in turn vLLM sleeps through the update; ahead it generates then
    assert next(p for p in in_turn.parts if p.name == VLLM_PART).phase == GENERATION
    assert next(p for p in ahead.parts if p.name == VLLM_PART).phase == ALWAYS

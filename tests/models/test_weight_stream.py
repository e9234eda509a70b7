"""The vllm engine's weight stream (`policy_weights`): under ZeRO-3 on 2 processes every rank gets every full
weight, and only the module being handed over is gathered at a time; a LoRA (PEFT) policy streams PEFT's own
merged weights (W + scale·B·A) in the base model's names, its training weights untouched."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from peft import LoraConfig, get_peft_model

from weight_stream_ranks import policy_model

from support.runs import run_ranks
from tokenpo.models.config import ModelConfig, TinyConfig
from tokenpo.models.loading import build_tiny_model
from tokenpo.models.weight_stream import policy_weights

TINY = ModelConfig(name="tiny", source="tiny", tiny=TinyConfig(hidden_size=32, num_layers=2, num_heads=4,
                                                                intermediate_size=64))


def lora_model(rank=4, alpha=8.0, modules_to_save=None, seed=0):
    """A tiny Llama with LoRA on every linear layer of the decoder and B random (not PEFT's zero init): the
    merged weights differ from the base ones."""
    base = build_tiny_model(TINY, 97, seed=seed)
    config = LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=0.1, target_modules="all-linear",
                        init_lora_weights=False, modules_to_save=modules_to_save)
    with torch.random.fork_rng():
        torch.manual_seed(seed + 1)
        return get_peft_model(base, config)


@pytest.mark.parametrize("modules_to_save", [None, ["input_layernorm"]])
def test_lora_stream_equals_peft_merge_and_unload_in_the_base_models_names(modules_to_save):
    model = lora_model(modules_to_save=modules_to_save)
    if modules_to_save:
        with torch.no_grad():  # the trained copies move away from the originals
            for name, param in model.named_parameters():
                if ".modules_to_save." in name:
                    param.add_(1.0)
    training = {name: p.detach().clone() for name, p in model.named_parameters()}
    streamed = dict(policy_weights(model, partitioned=False))
    merged = copy.deepcopy(model).merge_and_unload()
    expected = dict(policy_weights(merged, partitioned=False))
    # the base model's names and order: no PEFT prefix, no base_layer, no adapter matrices
    assert list(streamed) == list(expected) == [n for n, _ in build_tiny_model(TINY, 97, 0).named_parameters()] + [
        "lm_head.weight"]
    gap = max(float((streamed[n] - expected[n]).abs().max()) for n in expected)
    assert gap == 0.0, gap  # the same fp32 operations as PEFT's merge
    base = dict(policy_weights(build_tiny_model(TINY, 97, seed=0), partitioned=False))
    moved = [n for n in expected if not torch.equal(streamed[n], base[n])]
    layer0 = "model.layers.0."
    assert {f"{layer0}self_attn.q_proj.weight", f"{layer0}mlp.down_proj.weight"} <= set(moved)
    assert (f"{layer0}input_layernorm.weight" in moved) == bool(modules_to_save)
    # the training weights (base and adapters) are untouched
    assert all(torch.equal(p.detach(), training[n]) for n, p in model.named_parameters())


def test_lora_stream_with_adapters_disabled_is_the_base_model():
    model = lora_model(modules_to_save=["input_layernorm"])
    with model.disable_adapter():
        streamed = dict(policy_weights(model, partitioned=False))
    base = build_tiny_model(TINY, 97, seed=0)
    for name, weight in base.named_parameters():
        assert torch.equal(streamed[name], weight.detach()), name


@pytest.mark.multiproc
def test_zero3_stream_gives_every_rank_the_full_weights_one_module_at_a_time(tmp_path):
    """Plain and LoRA (merged per layer while its shards are gathered) policies alike."""
    run_ranks(Path(__file__).with_name("weight_stream_ranks.py"), [str(tmp_path)], nproc=2, log_dir=tmp_path)
    expected = {kind: dict(policy_weights(policy_model(lora=kind == "lora")[1], partitioned=False))
                for kind in ("full", "lora")}
    for kind, weights in expected.items():
        assert "lm_head.weight" in weights and len(weights) > 10
        for rank in range(2):
            streamed = torch.load(tmp_path / f"rank{rank}.pt")[kind]
            assert streamed["gathered_elsewhere"] == []
            assert list(streamed["weights"]) == list(weights)
            for name, weight in weights.items():
                torch.testing.assert_close(streamed["weights"][name], weight, rtol=0, atol=0, msg=f"{kind} {name}")
    # the LoRA stream is merged: an adapted weight is not the base one
    adapted = "model.layers.0.mlp.down_proj.weight"
    assert list(expected["lora"]) == list(expected["full"])
    assert not torch.equal(expected["lora"][adapted], expected["full"][adapted])

"""Passes that do not train run without dropout: the hf engine's sampling here, the old policy's and the reference's
log-probs in tests/trainer/test_update_modes.py."""

from __future__ import annotations

import torch

from tokenpo.models.config import LoraConfig, ModelConfig, TinyConfig
from tokenpo.models.loading import build_tiny_model
from tokenpo.models.lora import wrap_lora
from tokenpo.models.modes import no_dropout
from tokenpo.rollout import SamplingParams
from tokenpo.rollout.hf import generate_hf

PROMPTS = [[5, 17, 33], [9, 41, 8, 60]]


def adapted_model_with_dropout():
    """A tiny model with rank-4 adapters on every linear layer, dropout 0.5 on their input and B != 0 (at B = 0 the
    dropout would change nothing)."""
    cfg = ModelConfig(name="tiny", source="tiny", tiny=TinyConfig(hidden_size=32, num_layers=2, num_heads=4,
                                                                   intermediate_size=64))
    model = wrap_lora(build_tiny_model(cfg, 97, seed=3), LoraConfig(rank=4, alpha=8, dropout=0.5))
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator))
    return model.train()


def test_no_dropout_restores_either_mode():
    model = torch.nn.Sequential(torch.nn.Dropout(0.5))
    for training in (True, False):
        model.train(training)
        with no_dropout(model):
            assert not model.training and not model[0].training
        assert model.training is training and model[0].training is training


def test_sampling_under_adapter_dropout_repeats_and_leaves_the_model_training():
    model = adapted_model_with_dropout()
    params = SamplingParams(num_samples=3, max_new_tokens=10)
    first, second = (generate_hf(model, PROMPTS, params, 0, torch.Generator().manual_seed(1)) for _ in range(2))
    assert first.token_ids == second.token_ids
    assert model.training
    # the check can fail: in train mode the dropout changes the next-token distribution from call to call
    x = torch.tensor([PROMPTS[1]])
    with torch.no_grad():
        assert not torch.equal(model(input_ids=x).logits, model(input_ids=x).logits)

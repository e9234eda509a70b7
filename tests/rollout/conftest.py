"""The hf engine tests' model: a tiny Llama whose next token depends on its context."""

import pytest
import torch

from tokenpo.models.config import ModelConfig, TinyConfig
from tokenpo.models.loading import build_tiny_model

VOCAB = 97


@pytest.fixture(scope="module")
def model():
    cfg = ModelConfig(name="tiny", source="tiny", tiny=TinyConfig(hidden_size=32, num_layers=2, num_heads=4,
                                                                   intermediate_size=64))
    model = build_tiny_model(cfg, VOCAB, seed=3).eval()
    # weights 15x larger than HF's 0.02 init: attention is far from uniform, so the next token depends on the
    # context and its positions (a position or KV-cache bug changes greedy tokens instead of hiding in noise)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for weight in (p for p in model.parameters() if p.dim() == 2):
            weight.copy_(torch.randn(weight.shape, generator=generator) * 0.3)
    return model

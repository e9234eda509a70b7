"""A small model with context-dependent log-probs and a padded batch of two groups, for the log-prob tests."""

from __future__ import annotations

import torch

from tokenpo.models.config import ModelConfig, TinyConfig
from tokenpo.models.loading import build_tiny_model

VOCAB = 89
PAD = 0
GROUP = 3
# two groups: prompts of different lengths (left-padded), responses of different lengths (right-padded), one empty
PROMPTS = [[4, 19, 33, 7, 61], [12, 5]]
RESPONSES = [[8, 23, 41, 2], [17], [30, 30, 9, 55, 70, 3], [11, 6, 72], [], [44, 9]]
PROMPT_INDEX = torch.arange(len(RESPONSES)) // GROUP  # each row's prompt: G rows per group


def logprob_model():
    cfg = ModelConfig(name="tiny", source="tiny", tiny=TinyConfig(hidden_size=32, num_layers=2, num_heads=4,
                                                                   intermediate_size=64))
    model = build_tiny_model(cfg, VOCAB, seed=1)
    # larger than HF's 0.02 init, so that log-probs depend on context and positions (not only on the token)
    generator = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for weight in (p for p in model.parameters() if p.dim() == 2):
            weight.copy_(torch.randn(weight.shape, generator=generator) * 0.3)
    return model.eval()  # no dropout in Llama; eval() only silences the training flag


def padded_batch():
    width = max(map(len, PROMPTS))
    prompt_ids = torch.tensor([[PAD] * (width - len(p)) + p for p in PROMPTS])
    prompt_mask = (torch.arange(width)[None] >= torch.tensor([width - len(p) for p in PROMPTS])[:, None]).long()
    length = max(map(len, RESPONSES))
    response_ids = torch.tensor([r + [PAD] * (length - len(r)) for r in RESPONSES])
    response_mask = torch.tensor([[1.0] * len(r) + [0.0] * (length - len(r)) for r in RESPONSES])
    return prompt_ids, prompt_mask, response_ids, response_mask

"""Tensors for a set of (prompt, response) rows: left-padded prompts followed by right-padded responses."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Tokens:
    input_ids: torch.Tensor  # [b, P + T]
    attention_mask: torch.Tensor  # [b, P + T]
    response_mask: torch.Tensor  # [b, T] float, 1 on real response tokens


def pad_rows(prompts: list[list[int]], responses: list[list[int]], pad_id: int, device) -> Tokens:
    prompt_len = max(len(p) for p in prompts)
    resp_len = max(1, max(len(r) for r in responses))
    rows = len(prompts)
    ids = torch.full((rows, prompt_len + resp_len), pad_id, dtype=torch.long)
    attn = torch.zeros((rows, prompt_len + resp_len), dtype=torch.long)
    resp_mask = torch.zeros((rows, resp_len), dtype=torch.float32)
    for i, (prompt, response) in enumerate(zip(prompts, responses)):
        ids[i, prompt_len - len(prompt) : prompt_len] = torch.tensor(prompt)
        attn[i, prompt_len - len(prompt) : prompt_len + len(response)] = 1
        if response:
            ids[i, prompt_len : prompt_len + len(response)] = torch.tensor(response)
            resp_mask[i, : len(response)] = 1.0
    return Tokens(ids.to(device), attn.to(device), resp_mask.to(device))


def micro_batches(indices: list[int], lengths: list[int], size: int) -> list[list[int]]:
    """Split rows into micro-batches of similar response length, so padding stays small."""
    by_length = sorted(indices, key=lambda i: lengths[i])
    return [by_length[lo : lo + size] for lo in range(0, len(by_length), size)]


def pad_to(rows: list[torch.Tensor], width: int) -> torch.Tensor:
    """Stack 1-D float tensors right-padded with zeros to `width`."""
    out = torch.zeros(len(rows), width, dtype=torch.float32)
    for i, row in enumerate(rows):
        out[i, : row.numel()] = row
    return out

"""Tensors for whole groups: left-padded prompts (one per group) and right-padded responses (G per group, or a
slice of one group's rows); how a step's groups are split into micro-batches."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tokenpo.models.logprobs import left_pad


@dataclass
class GroupTokens:
    prompt_ids: torch.Tensor  # [groups, P]
    prompt_mask: torch.Tensor  # [groups, P]
    response_ids: torch.Tensor  # [groups * G, T]
    response_mask: torch.Tensor  # [groups * G, T] float, 1 on real response tokens


def pad_groups(prompts: list[list[int]], responses: list[list[int]], pad_id: int, device) -> GroupTokens:
    prompt_ids, prompt_mask = left_pad(prompts, pad_id)
    resp_len = max(1, max(len(r) for r in responses))
    response_ids = torch.full((len(responses), resp_len), pad_id, dtype=torch.long)
    response_mask = torch.zeros((len(responses), resp_len), dtype=torch.float32)
    for i, response in enumerate(responses):
        if response:
            response_ids[i, : len(response)] = torch.tensor(response)
            response_mask[i, : len(response)] = 1.0
    return GroupTokens(prompt_ids.to(device), prompt_mask.to(device), response_ids.to(device), response_mask.to(device))


@dataclass
class MicroBatch:
    """The rows of one forward and backward: whole groups, or (micro-batch below a group) some rows of one group."""
    groups: list[int]  # prompts of the pass, each run once for its rows
    rows: list[int]  # rows of those groups, G per group or a slice of one group's G

    @property
    def rows_per_prompt(self) -> int:
        return len(self.rows) // len(self.groups)


def rows_of(groups: list[int], group_size: int) -> list[int]:
    return [g * group_size + j for g in groups for j in range(group_size)]


def group_micro_batches(groups: list[int], longest: list[int], sequences_per_batch: int,
                        group_size: int) -> list[MicroBatch]:
    """Split groups into micro-batches of about `sequences_per_batch` rows, groups of similar longest
    response together, so padding stays small. Below a group, each group's rows are split into slices of
    `sequences_per_batch` (the last one shorter), as verl's ppo_micro_batch_size_per_gpu splits by rows down
    to one sequence: group statistics and loss normalisers are computed on the whole batch before the update,
    so a split by rows leaves the loss unchanged."""
    ordered = sorted(groups, key=lambda g: longest[g])
    if sequences_per_batch < group_size:
        return [MicroBatch([g], rows_of([g], group_size)[lo : lo + sequences_per_batch])
                for g in ordered for lo in range(0, group_size, sequences_per_batch)]
    per_batch = sequences_per_batch // group_size
    return [MicroBatch(chunk, rows_of(chunk, group_size))
            for chunk in (ordered[lo : lo + per_batch] for lo in range(0, len(ordered), per_batch))]


def pad_to(rows: list[torch.Tensor], width: int) -> torch.Tensor:
    """Stack 1-D float tensors right-padded with zeros to `width`."""
    out = torch.zeros(len(rows), width, dtype=torch.float32)
    for i, row in enumerate(rows):
        out[i, : row.numel()] = row
    return out

"""The step's batch as the update reads it (`RolloutBatch`, tensors built once after scoring), and how its rows become
forward/backward passes: which rank trains which groups, how each rank's rows split into micro-batches (by sequence
count or by a token budget), and the tensors of one micro-batch (left-padded prompts, one per group it holds, and
right-padded responses).

Every rank knows the whole step batch, so every rank computes the same plan without communicating. Under ZeRO-3 each
forward gathers parameters with collectives, so every rank runs the same number of passes: the plan gives each rank
of a mini-batch the same micro-batch count. Nothing here changes which rows train or their weights: the loss
normalisers are the whole step's (tokenpo.algorithms.LossNorm), so any split gives the same update.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tokenpo.data import Example
from tokenpo.models.logprobs import left_pad


@dataclass
class GroupTokens:
    prompt_ids: torch.Tensor  # [prompts, P]
    prompt_mask: torch.Tensor  # [prompts, P]
    response_ids: torch.Tensor  # [rows, T]
    response_mask: torch.Tensor  # [rows, T] float, 1 on real response tokens
    prompt_index: torch.Tensor  # [rows] long: each row's prompt (a row of prompt_ids)


def pad_groups(prompts: list[list[int]], responses: list[list[int]], pad_id: int, device,
               prompt_index: list[int] | None = None) -> GroupTokens:
    """The tensors of `prompts` and their `responses`; `prompt_index` names each response's prompt (None: the same
    number of consecutive responses per prompt)."""
    prompt_ids, prompt_mask = left_pad(prompts, pad_id)
    resp_len = max(1, max(len(r) for r in responses))
    response_ids = torch.full((len(responses), resp_len), pad_id, dtype=torch.long)
    response_mask = torch.zeros((len(responses), resp_len), dtype=torch.float32)
    for i, response in enumerate(responses):
        if response:
            response_ids[i, : len(response)] = torch.tensor(response)
            response_mask[i, : len(response)] = 1.0
    if prompt_index is None:
        index = torch.arange(len(responses)) // max(1, len(responses) // len(prompts))
    else:
        index = torch.tensor(prompt_index, dtype=torch.long)
    return GroupTokens(prompt_ids.to(device), prompt_mask.to(device), response_ids.to(device),
                       response_mask.to(device), index.to(device))


@dataclass
class MicroBatch:
    """The rows of one forward and backward: whole groups, some rows of one group, or (token budget) rows of any
    groups; each of `groups` is run once for its rows."""
    groups: list[int]  # the groups whose rows the pass holds, in the order their prompts are laid out
    rows: list[int]  # row indices of the step batch

    def prompt_index(self, group_size: int) -> list[int]:
        """Each row's position in `groups`: the prompt it continues."""
        position = {group: i for i, group in enumerate(self.groups)}
        return [position[row // group_size] for row in self.rows]


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


def micro_batch_of_rows(rows: list[int], group_size: int) -> MicroBatch:
    """A micro-batch of `rows` (any groups), rows and groups in index order."""
    rows = sorted(rows)
    return MicroBatch(sorted({row // group_size for row in rows}), rows)


def token_micro_batches(rows: list[int], row_tokens: list[int], budget: int, group_size: int,
                        padded: bool = False) -> list[MicroBatch]:
    """`rows` into micro-batches of at most `budget` tokens (a row's tokens: its prompt + response), the longest row
    first. Packed passes (`padded` false) count the rows' own tokens and fill first-fit decreasing: each row into the
    first micro-batch it fits, else a new one (FFD uses at most 11/9 of the fewest possible micro-batches + 1).
    Padded passes run every row at the length of the pass's longest (the one-call path pads to it; the shared-prompt
    path's buckets come close), so they count rows x the longest row, and fill next-fit decreasing: rows of similar
    length together, a new micro-batch when the next row would pass the budget. A row longer than the budget is a
    micro-batch of its own (the start-up check refuses a budget below the longest prompt + rollout.max_new_tokens).
    Rows of one group may land in different micro-batches."""
    bins: list[list[int]] = []
    loads: list[int] = []
    for row in sorted(rows, key=lambda r: (-row_tokens[r], r)):
        if padded:  # the current micro-batch's longest row is its first
            fits = bins and (len(bins[-1]) + 1) * row_tokens[bins[-1][0]] <= budget
            fit = len(bins) - 1 if fits else None
        else:
            fit = next((i for i, load in enumerate(loads) if load + row_tokens[row] <= budget), None)
        if fit is None:
            bins.append([row])
            loads.append(row_tokens[row])
        else:
            bins[fit].append(row)
            loads[fit] += row_tokens[row]
    return [micro_batch_of_rows(rows_in, group_size) for rows_in in bins]


def split_to_count(micro_batches: list[MicroBatch], count: int, row_tokens: list[int],
                   group_size: int) -> list[MicroBatch]:
    """`micro_batches` split until there are `count` of them: the one with the most tokens (of those with two rows
    or more) into two halves of similar tokens. Every part stays within the budget its whole kept. Needs at least
    `count` rows in all."""
    parts = list(micro_batches)
    while len(parts) < count:
        splittable = [i for i, micro in enumerate(parts) if len(micro.rows) > 1]
        if not splittable:
            raise ValueError(f"{sum(len(m.rows) for m in parts)} rows cannot make {count} micro-batches")
        largest = max(splittable, key=lambda i: (sum(row_tokens[r] for r in parts[i].rows), -i))
        halves: list[list[int]] = [[], []]
        loads = [0, 0]
        for row in sorted(parts[largest].rows, key=lambda r: (-row_tokens[r], r)):
            lighter = 0 if loads[0] <= loads[1] else 1
            halves[lighter].append(row)
            loads[lighter] += row_tokens[row]
        parts[largest : largest + 1] = [micro_batch_of_rows(half, group_size) for half in halves]
    return parts


def assign_groups(groups: list[int], group_tokens: list[int], world: int, balance: str) -> list[list[int]]:
    """[rank] -> its groups (in index order), each rank the same number. `round_robin`: the i-th of `groups` to rank
    i mod world. `tokens`: longest processing time first with equal counts: the group with the most tokens to the rank
    with the fewest tokens so far among those still short of their share, so the busiest rank's tokens stay close to
    the mean."""
    share = len(groups) // world
    if balance == "round_robin":
        return [groups[rank::world] for rank in range(world)]
    assigned: list[list[int]] = [[] for _ in range(world)]
    loads = [0] * world
    for group in sorted(groups, key=lambda g: (-group_tokens[g], g)):
        rank = min((r for r in range(world) if len(assigned[r]) < share), key=lambda r: (loads[r], r))
        assigned[rank].append(group)
        loads[rank] += group_tokens[group]
    return [sorted(rank_groups) for rank_groups in assigned]


@dataclass(frozen=True)
class BatchSplit:
    """How the step's rows split into passes (trainer.*)."""

    group_size: int
    micro_batch_size: int  # sequences per pass, when no token budget is set
    micro_batch_tokens: int | None  # prompt + response tokens per pass (None: by sequence count)
    balance_ranks: str  # tokens | round_robin
    packed: bool = False  # passes without padding (trainer.pack_sequences): the budget counts the rows' own tokens


@dataclass(frozen=True)
class UpdatePlan:
    """passes[m][r]: the micro-batches rank r runs in mini-batch m (every rank the same count in a mini-batch)."""

    passes: list[list[list[MicroBatch]]]
    rank_tokens: list[int]  # prompt + response tokens each rank trains over the step

    def of_rank(self, rank: int) -> list[list[MicroBatch]]:
        """Rank `rank`'s micro-batches, per mini-batch."""
        return [per_rank[rank] for per_rank in self.passes]

    @property
    def rank_imbalance(self) -> float:
        """The busiest rank's tokens over the mean, minus 1 (0: balanced; the step waits for the busiest rank)."""
        mean = sum(self.rank_tokens) / len(self.rank_tokens)
        return max(self.rank_tokens) / mean - 1.0 if mean else 0.0


def update_plan(split: BatchSplit, prompt_tokens: list[int], response_tokens: list[int], mini_batches: int,
                world: int) -> UpdatePlan:
    """The plan of a step with `prompt_tokens` per group and `response_tokens` per row (group-major,
    `split.group_size` rows per group; a row's tokens are its prompt's and its response's):
    mini-batch m trains groups [m·n, (m+1)·n), n = groups / mini_batches (the loss normalisers' split), its groups
    assigned to ranks (`assign_groups`), each rank's share cut into micro-batches by sequence count
    (`group_micro_batches`, groups of similar longest response together) or by token budget
    (`token_micro_batches`), then the ranks brought to one count (`split_to_count`)."""
    g = split.group_size
    num_groups = len(prompt_tokens)
    row_tokens = [prompt_tokens[i // g] + n for i, n in enumerate(response_tokens)]
    group_tokens = [sum(row_tokens[i * g : (i + 1) * g]) for i in range(num_groups)]
    longest = [max(response_tokens[i * g : (i + 1) * g]) for i in range(num_groups)]
    per_mini = num_groups // mini_batches
    passes, rank_tokens = [], [0] * world
    for lo in range(0, num_groups, per_mini):
        by_rank = assign_groups(list(range(lo, lo + per_mini)), group_tokens, world, split.balance_ranks)
        if split.micro_batch_tokens is None:
            micro = [group_micro_batches(groups, longest, split.micro_batch_size, g) for groups in by_rank]
        else:
            micro = [token_micro_batches(rows_of(groups, g), row_tokens, split.micro_batch_tokens, g, not split.packed)
                     for groups in by_rank]
            count = max(map(len, micro))
            micro = [split_to_count(parts, count, row_tokens, g) for parts in micro]
        passes.append(micro)
        for rank, groups in enumerate(by_rank):
            rank_tokens[rank] += sum(group_tokens[group] for group in groups)
    return UpdatePlan(passes, rank_tokens)


def pad_to(rows: list[torch.Tensor], width: int) -> torch.Tensor:
    """Stack 1-D float tensors right-padded with zeros to `width`."""
    out = torch.zeros(len(rows), width, dtype=torch.float32)
    for i, row in enumerate(rows):
        out[i, : row.numel()] = row
    return out


@dataclass(frozen=True)
class SamplingCounts:
    """How the step's batch was collected, over every dynamic-sampling round (logged as dynamic_sampling/*,
    accuracy/drawn and tokens/generated)."""

    rounds: int = 0
    generated_groups: int = 0  # groups generated over all rounds
    generated_tokens: int = 0  # response tokens generated over all rounds, kept or filtered out (all ranks)
    mixed_groups: int = 0  # generated groups that passed the filter (all of them without dynamic sampling)
    drawn_correct: int = 0  # responses generated over all rounds, kept or filtered out, judged correct
    drawn_judged: int = 0  # of those responses, the ones whose gold answer parses
    filled_groups: int = 0  # all-equal groups added to reach prompts_per_step (on_exhausted: fill)
    dropped_groups: int = 0  # mixed groups left out: beyond prompts_per_step, or the uneven rest (keep_partial)
    exhausted: bool = False  # max_gen_batches rounds found fewer mixed groups than prompts_per_step


@dataclass(frozen=True)
class RolloutBatch:
    """The step's batch, built once after scoring and gathering (tokenpo.trainer.core.rollouts.rollout_batch), the same on
    every rank and never written to. N responses, group-major (`group_size` rows per group); T the longest response
    (at least 1), P the longest prompt."""

    examples: list[Example]  # one per group
    group_size: int
    prompt_ids: torch.Tensor  # [groups, P] long, right-aligned (left-padded with 0), as the sampler lays them out
    prompt_lengths: torch.Tensor  # [groups] long
    response_ids: torch.Tensor  # [N, T] long, right-padded with 0
    lengths: torch.Tensor  # [N] long: response tokens
    group_ids: torch.Tensor  # [N] long: the group of each response
    correct: torch.Tensor  # [N] bool: the answer matches the gold one
    valid: torch.Tensor  # [N] bool: in the loss (its gold parses, or a reward function could judge it)
    score: torch.Tensor | None  # [N] float: reward.functions' weighted sum; None: the verdicts alone are the reward
    truncated: torch.Tensor  # [N] bool: stopped by max_new_tokens
    in_format: torch.Tensor  # [N] float: 1 where the answer is given in the asked-for form
    # [N, T] float, 0 on padding: the rollout engine's log-probs of the sampled tokens; None where it returns none
    sampler_logprobs: torch.Tensor | None
    versions: torch.Tensor | None  # [N] long: the policy version that sampled each response (None: not known)
    verdicts: list[str]  # [N] the scorer's verdicts (metrics and the samples table)
    response_text: list[str]  # [N] (the samples table)
    counts: SamplingCounts

    def plan(self, split: BatchSplit, mini_batches: int, world: int) -> UpdatePlan:
        """Which rank trains which rows in which micro-batches (`update_plan`)."""
        return update_plan(split, self.prompt_lengths.tolist(), self.lengths.tolist(), mini_batches, world)

    def tokens(self, micro: MicroBatch, pad_id: int, device: torch.device) -> GroupTokens:
        """One micro-batch's tensors: each of its prompts once (left-padded), its rows' responses (right-padded), as
        `pad_groups` lays them out."""
        groups, rows = torch.tensor(micro.groups, dtype=torch.long), torch.tensor(micro.rows, dtype=torch.long)
        prompt_lengths = self.prompt_lengths[groups].unsqueeze(1)
        prompt_width = int(prompt_lengths.max())
        prompt_mask = (torch.arange(prompt_width) >= prompt_width - prompt_lengths).long()  # [prompts, P']
        prompt_ids = self.prompt_ids[groups, self.prompt_ids.shape[1] - prompt_width:].masked_fill(prompt_mask == 0,
                                                                                                  pad_id)
        lengths = self.lengths[rows].unsqueeze(1)
        width = max(1, int(lengths.max()))
        response_mask = (torch.arange(width) < lengths).float()  # [rows, T']
        response_ids = self.response_ids[rows, :width].masked_fill(response_mask == 0, pad_id)
        index = torch.tensor(micro.prompt_index(self.group_size), dtype=torch.long)
        return GroupTokens(prompt_ids.to(device), prompt_mask.to(device), response_ids.to(device),
                           response_mask.to(device), index.to(device))

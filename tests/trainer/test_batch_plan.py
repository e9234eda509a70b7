"""The update plan (tokenpo.trainer.core.batch): every row trained once per mini-batch, each rank the same number of
passes, token budgets kept, and groups dealt to ranks by tokens so the busiest rank is close to the mean."""

from __future__ import annotations

import random

import pytest

from tokenpo.trainer.core.batch import (BatchSplit, MicroBatch, assign_groups, split_to_count, token_micro_batches,
                                   update_plan)


def skewed_lengths(groups: int, group_size: int, seed: int) -> tuple[list[int], list[int]]:
    """(prompt tokens per group, response tokens per row): most answers short, one group in four long."""
    rng = random.Random(seed)
    prompts = [rng.randint(20, 60) for _ in range(groups)]
    responses = [rng.randint(400, 512) if (i // group_size) % 4 == 0 else rng.randint(5, 60)
                 for i in range(groups * group_size)]
    return prompts, responses


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("budget", [None, 600, 2000])
@pytest.mark.parametrize("world", [1, 2, 4])
@pytest.mark.parametrize("balance", ["tokens", "round_robin"])
def test_every_row_once_and_every_rank_the_same_number_of_passes(budget, world, balance, packed):
    g, groups, mini_batches = 4, 16, 2
    prompts, responses = skewed_lengths(groups, g, seed=world)
    plan = update_plan(BatchSplit(g, 8, budget, balance, packed), prompts, responses, mini_batches, world)
    assert len(plan.passes) == mini_batches
    per_mini = groups // mini_batches
    for m, per_rank in enumerate(plan.passes):
        assert len(per_rank) == world and len({len(micro) for micro in per_rank}) == 1  # ZeRO-3: same pass count
        rows = sorted(row for micro in per_rank for batch in micro for row in batch.rows)
        assert rows == list(range(m * per_mini * g, (m + 1) * per_mini * g))  # each row of the mini-batch once
        # each rank holds the same number of whole groups
        assert len({sum(len(batch.rows) for batch in micro) for micro in per_rank}) == 1
        for micro in per_rank:
            for batch in micro:
                assert sorted(batch.groups) == sorted({row // g for row in batch.rows})
                tokens = [prompts[r // g] + responses[r] for r in batch.rows]
                if budget is not None:  # padded passes run every row at the longest one's length
                    assert (sum(tokens) if packed else len(tokens) * max(tokens)) <= budget
    row_tokens = [prompts[i // g] + n for i, n in enumerate(responses)]
    assert sum(plan.rank_tokens) == sum(row_tokens)


def test_token_balancing_lowers_the_busiest_ranks_tokens():
    g, groups, world = 4, 16, 4
    prompts, responses = skewed_lengths(groups, g, seed=3)
    balanced = update_plan(BatchSplit(g, 8, None, "tokens"), prompts, responses, 1, world)
    dealt = update_plan(BatchSplit(g, 8, None, "round_robin"), prompts, responses, 1, world)
    # one group in four is long: dealt in turn, every long group lands on rank 0
    assert dealt.rank_imbalance > 1.0
    assert balanced.rank_imbalance < 0.1
    assert sorted(balanced.rank_tokens) != sorted(dealt.rank_tokens)


def test_longest_processing_time_keeps_equal_counts():
    assert assign_groups([0, 1, 2, 3], [100, 90, 10, 5], 2, "tokens") == [[0, 3], [1, 2]]
    assert assign_groups([0, 1, 2, 3], [100, 90, 10, 5], 2, "round_robin") == [[0, 2], [1, 3]]
    assert assign_groups([4, 5, 6, 7, 8, 9], [0] * 4 + [1, 50, 3, 40, 2, 60], 3, "tokens") == [[4, 9], [5, 8], [6, 7]]


def test_first_fit_decreasing_fills_the_budget_and_keeps_oversized_rows_alone():
    tokens = [30, 5, 25, 10, 70]  # rows 0-4, groups of 2
    micro = token_micro_batches([0, 1, 2, 3, 4], tokens, 40, 2)
    assert [sorted(m.rows) for m in micro] == [[4], [0, 3], [1, 2]]
    assert micro[1].prompt_index(2) == [0, 1] and micro[2].prompt_index(2) == [0, 1]


def test_padded_passes_keep_rows_of_similar_length_together():
    tokens = [500, 20, 30, 480, 25, 40]  # rows 0-5, groups of 2
    padded = token_micro_batches(list(range(6)), tokens, 1000, 2, padded=True)
    assert [sorted(m.rows) for m in padded] == [[0, 3], [1, 2, 4, 5]]  # 2 x 500 and 4 x 40 padded tokens
    packed = token_micro_batches(list(range(6)), tokens, 1000, 2)
    # first fit: 500 + 480, then 40, 30, 25 into a second pass, 20 back into the first (exactly 1000)
    assert [sorted(m.rows) for m in packed] == [[0, 1, 3], [2, 4, 5]]


def test_splitting_to_a_count_halves_the_largest_pass():
    tokens = [10, 10, 10, 10, 1, 1]
    parts = split_to_count([MicroBatch([0, 1], [0, 1, 2, 3]), MicroBatch([2], [4, 5])], 4, tokens, 2)
    assert sorted(sorted(m.rows) for m in parts) == [[0], [1, 3], [2], [4, 5]]
    with pytest.raises(ValueError, match="cannot make 3 micro-batches"):
        split_to_count([MicroBatch([0], [0, 1])], 3, tokens, 2)

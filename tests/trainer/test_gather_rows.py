"""The step's gather of the old policy's per-row entropy over ranks: a tensor all_gather (dist.all_gather_rows)
instead of pickled dicts, bit-identical to the pickled gather, on 2 gloo ranks."""

from __future__ import annotations

from pathlib import Path

import gather_ranks
import pytest
import torch
from support.runs import run_ranks

from tokenpo.trainer.core.step import gather_rows


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("gather_ranks")
    run_ranks(Path(gather_ranks.__file__), [str(out)], 2, out / "logs", timeout_s=180)
    return [torch.load(out / f"rank{rank}.pt") for rank in range(2)]


@pytest.mark.multiproc
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_tensor_gather_is_bit_identical_to_the_pickled_one_on_every_rank(ranks, dtype):
    for got in ranks:
        tensor, pickled, expected = got[dtype]["tensor"], got[dtype]["pickled"], got[dtype]["expected"]
        assert tensor.dtype == pickled.dtype == torch.float32 and tensor.shape == (15, gather_ranks.MAX_LEN)
        assert torch.equal(tensor, pickled) and torch.equal(tensor, expected)
        assert bool((tensor != 0).any(dim=1).all())  # every row came from one of the ranks


@pytest.mark.multiproc
def test_uneven_shapes_come_back_as_each_rank_sent_them(ranks):
    for got in ranks:
        first, second = got["uneven"]
        assert torch.equal(first, torch.arange(15, dtype=torch.float64).view(3, 5))
        assert second.shape == (0, 7) and second.dtype == torch.float64


def test_one_process_places_its_rows_by_index():
    rows = {2: torch.tensor([1.0, 2.0]), 0: torch.tensor([3.0]), 1: torch.tensor([], dtype=torch.float32)}
    assert torch.equal(gather_rows(rows, 3, 3), torch.tensor([[3.0, 0, 0], [0, 0, 0], [1.0, 2.0, 0]]))

"""Caller-owned gradient accumulation (issue 26): under tokenpo's engine config, 2 accumulated micro-batches update
the weights as 1 micro-batch holding both, at ZeRO 0-3, and both as plain PyTorch does with all ranks' rows.

A DeepSpeed that ignores `managed_gradient_accumulation` (before 0.19.4) treats every backward as an accumulation
boundary, and ZeRO-2 then keeps only the last micro-batch's gradient: the accumulated update differs from the
whole one. The ranks (accumulation_ranks.py) take one SGD step with lr 1, so each update is the gradient itself.
One process in this one (ZeRO 1-2 lose a micro-batch there too when the key is dropped); two ranks, slow.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import accumulation_ranks as ranks
import pytest
import torch

from support.runs import in_process_training, run_ranks
from tokenpo.deepspeed import dist

STAGES = (0, 1, 2, 3)
# fp32 summation order: at most 1.2e-7 in 30 runs of a stage with one thread per process; once 8.6e-6 with two
# (a busy machine). The largest gradient is 0.8, and a lost micro-batch moves it by 0.55
ATOL = 1e-5


@contextlib.contextmanager
def one_thread():
    """One intra-op thread, as the ranks compute (accumulation_ranks.main)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def plain_update(world_size: int) -> dict[str, torch.Tensor]:
    """lr 1 x the gradient of the mean loss over every rank's rows, in plain PyTorch on one process."""
    model = ranks.tiny_model()
    rows = [ranks.rank_rows(rank) for rank in range(world_size)]
    inputs, targets = torch.cat([x for x, _ in rows]), torch.cat([y for _, y in rows])
    with one_thread():
        ranks.loss_share(model, inputs, targets, global_rows=len(inputs)).backward()
    return {name: p.grad for name, p in model.named_parameters()}


def updates(out: Path, stage: int) -> tuple[dict, dict]:
    return tuple(torch.load(out / f"zero{stage}-{way}.pt") for way in ranks.WAYS)


def assert_same(got: dict, want: dict, what: str) -> None:
    assert got.keys() == want.keys()
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=0, atol=ATOL, msg=lambda m: f"{what}, {name}: {m}")


def check_stages(out: Path, world_size: int) -> None:
    want = plain_update(world_size)
    # far above the tolerance, so that a lost micro-batch shows
    assert min(float(g.abs().max()) for g in want.values()) > 1e-2
    for stage in STAGES:
        accumulated, whole = updates(out, stage)
        assert_same(whole, want, f"zero{stage}: one micro-batch vs plain PyTorch")
        assert_same(accumulated, whole, f"zero{stage}: 2 accumulated micro-batches vs one")


@pytest.mark.e2e
def test_one_process_accumulates_two_micro_batches_as_one(tmp_path):
    with in_process_training(), one_thread():
        dist.init_distributed("gloo")
        ranks.write_updates(tmp_path, list(STAGES))
    check_stages(tmp_path, world_size=1)


@pytest.mark.slow
@pytest.mark.multiproc
def test_two_ranks_accumulate_two_micro_batches_as_one(tmp_path):
    run_ranks(Path(ranks.__file__), [str(tmp_path), *map(str, STAGES)], 2, tmp_path / "logs")
    check_stages(tmp_path, world_size=2)

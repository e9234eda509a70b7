"""Run as 2 ranks (gloo) by test_gather_rows.py: gather per-row tensors of uneven lengths as a step gathers the old
policy's entropy (tokenpo.trainer.core.step.gather_rows, tensor all_gathers) and as the trainer did before (pickled
dicts through all_gather_object), and tensors of uneven shapes through dist.all_gather_rows. Each rank writes
<out>/rank<r>.pt with what it got."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed

from tokenpo.deepspeed import dist
from tokenpo.trainer.core.batch import pad_to
from tokenpo.trainer.core.step import gather_rows

GROUPS, GROUP_SIZE, MAX_LEN = 5, 3, 9  # 5 groups over 2 ranks: rank 0 holds 3 of them, rank 1 two


def step_rows(dtype: torch.dtype) -> dict[int, torch.Tensor]:
    """Every row of a step: random lengths 1..MAX_LEN and values, the same on every rank (seeded)."""
    gen = torch.Generator().manual_seed(11)
    rows = {}
    for i in range(GROUPS * GROUP_SIZE):
        length = int(torch.randint(1, MAX_LEN + 1, (1,), generator=gen))
        rows[i] = torch.randn(length, generator=gen).to(dtype)
    return rows


def pickled_gather(local_rows: dict[int, torch.Tensor], num_rows: int, width: int) -> torch.Tensor:
    """The trainer's gather before the tensor collective: every rank's dict pickled, merged, padded."""
    gathered = {}
    for part in dist.all_gather_objects(local_rows):
        gathered.update(part)
    return pad_to([gathered[i] for i in range(num_rows)], width)


def main(out: Path) -> None:
    torch.distributed.init_process_group("gloo")
    rank = dist.rank()
    mine = range(rank, GROUPS, dist.world_size())  # the groups this rank trains, as the step splits them
    result = {}
    for name, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
        rows = step_rows(dtype)
        local = {g * GROUP_SIZE + j: rows[g * GROUP_SIZE + j] for g in mine for j in range(GROUP_SIZE)}
        width = MAX_LEN
        result[name] = {"tensor": gather_rows(local, len(rows), width),
                        "pickled": pickled_gather(local, len(rows), width),
                        "expected": pad_to([rows[i] for i in range(len(rows))], width)}
    # uneven shapes, one of them empty: each rank gets every rank's tensor back as it was
    shapes = [(3, 5), (0, 7)]
    own = torch.arange(shapes[rank][0] * shapes[rank][1], dtype=torch.float64).view(shapes[rank]) + 100 * rank
    result["uneven"] = dist.all_gather_rows(own)
    torch.save(result, out / f"rank{rank}.pt")
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))

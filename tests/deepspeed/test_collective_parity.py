"""Under ZeRO-3 on 2 processes every pass makes the same parameter gathers on both ranks, whatever each rank's
lengths: the worst-case pass, the old-policy, reference and gradient passes with their backward (recompute_head's
included), a pass with no response token on one rank, token-budget and packed passes, LoRA, evaluation and hf
generation (parity_ranks.py records them with support.gathers). A rank that gathered once more than the other would
wait in a collective the other never joins: the ranks cut their timeouts to a minute, so that fails fast too.

The cases are drawn from a seeded generator (TOKENPO_PARITY_SEED picks another draw): chunk sizes of 1 to 7 tokens
against responses of 0 to 24, so the output layer runs in several chunks and the ranks' counts differ without the fix.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import parity_ranks
import pytest

from support.runs import run_ranks

pytestmark = pytest.mark.multiproc

# how a rank's share splits into passes: by sequences (one group, two groups), by a token budget (the longest row is
# 9 + 24 tokens), packed under that budget
SPLITS = (["trainer.micro_batch_size=2"], ["trainer.micro_batch_size=4"], ["trainer.micro_batch_tokens=40"],
          ["trainer.micro_batch_tokens=48", "trainer.pack_sequences=true"])


def draw_cases(seed: int) -> list[dict]:
    """One case per split, each with a random chunk size, LoRA on or off and recompute_head on or off, the last two
    alternating so both values of each meet every kind of split across the cases."""
    rng = random.Random(seed)
    cases = []
    for i, split in enumerate(SPLITS):
        overrides = [*split, f"trainer.logit_chunk_tokens={rng.randint(1, 7)}",
                     f"model.lora.rank={4 if i % 2 else 0}", f"trainer.recompute_head={str(i in (1, 2)).lower()}"]
        cases.append({"name": f"case{i}", "overrides": overrides, "seed": rng.randint(0, 10**6)})
    return cases


CASES = draw_cases(int(os.environ.get("TOKENPO_PARITY_SEED", "0")))


@pytest.fixture(scope="module")
def records(tmp_path_factory) -> dict[str, list]:
    out = tmp_path_factory.mktemp("parity")
    run_ranks(Path(parity_ranks.__file__), [str(out), *map(json.dumps, CASES)], 2, out / "logs",
              timeout_s=120 + 90 * len(CASES))
    return {case["name"]: json.loads((out / f"{case['name']}.json").read_text()) for case in CASES}


@pytest.mark.parametrize("case", CASES, ids=[" ".join(case["overrides"]) for case in CASES])
def test_both_ranks_gather_alike_in_every_pass(case, records):
    rank0, rank1 = records[case["name"]]
    assert [p["label"] for p in rank0] == ["worst_case", "update", "evaluation", "generation"]
    for mine, theirs in zip(rank0, rank1):
        assert mine["fetches"], mine["label"]
        assert mine["fetches"] == theirs["fetches"], mine["label"]
        assert (mine["all_gathers"], mine["gathered_numel"]) == (theirs["all_gathers"], theirs["gathered_numel"])
        assert [chunks for _, chunks in mine["chunks"]] == [chunks for _, chunks in theirs["chunks"]], mine["label"]


@pytest.mark.parametrize("case", CASES, ids=[" ".join(case["overrides"]) for case in CASES])
def test_the_ranks_lengths_differed_and_were_chunked(case, records):
    """The case proves something: in the update the two ranks' passes held different numbers of response tokens, and
    some pass ran the output layer in several chunks."""
    update0, update1 = (next(p for p in rank if p["label"] == "update") for rank in records[case["name"]])
    tokens0, tokens1 = [tokens for tokens, _ in update0["chunks"]], [tokens for tokens, _ in update1["chunks"]]
    assert tokens0 != tokens1
    assert max(chunks for _, chunks in update0["chunks"]) > 1


def test_some_pass_has_no_response_token_on_one_rank_only(records):
    """An empty micro-batch on one rank beside a full one on the other (group 0's empty responses)."""
    def lonely(rank_a, rank_b):
        return any((ta == 0) != (tb == 0) for pa, pb in zip(rank_a, rank_b) if pa["label"] == "update"
                   for (ta, _), (tb, _) in zip(pa["chunks"], pb["chunks"]))

    assert any(lonely(*ranks) for ranks in records.values())

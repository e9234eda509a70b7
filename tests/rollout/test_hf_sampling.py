"""The `hf` engine's sampler and stop rule: the two-level inverse CDF picks what one float64 cumulative sum over the
vocabulary picked (the sampler before it: tokenpo/bench/previous_hf.py), samples the softmax, never a
zero-probability token; the tokens do not depend on rollout.hf_stop_check_every, and the host drops stopped rows only
at its checks."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from tokenpo.bench.previous_hf import previous_generate_hf, previous_sample_next
from tokenpo.errors import ConfigError
from tokenpo.rollout import SamplingParams, build_generator
from tokenpo.rollout import hf
from tokenpo.rollout.config import RolloutConfig, rollout_config_from_dict
from tokenpo.rollout.hf import generate_hf, inverse_cdf, sample_next, stop_check_every

PAD = 0
PROMPTS = [[5, 17, 33], [9, 41, 8, 60, 12, 71, 3], [88, 14, 27, 50, 6]]


def random_logits(rows: int, vocab: int, seed: int) -> torch.Tensor:
    """Rows from flat (scale 0.5) to peaked (scale 12), as a language model's next-token logits range."""
    generator = torch.Generator().manual_seed(seed)
    scale = torch.logspace(-0.3, 1.08, rows)[:, None]
    return torch.randn(rows, vocab, generator=generator) * scale


@pytest.mark.parametrize("temperature, top_p", [(1.0, 1.0), (0.7, 1.0), (1.0, 0.9), (0.7, 0.9)])
@pytest.mark.parametrize("vocab, rows", [(49152, 48), (151936, 16), (1000, 256)])
def test_two_level_sampler_picks_what_one_float64_cumsum_picked(vocab, rows, temperature, top_p):
    """The same generator draws the same uniform numbers (one per row), which pick the same tokens: 49152 and 1000
    are not multiples of the block size 256 (1000: 3 whole blocks + 232), 151936 = 593 blocks + 128."""
    params = SamplingParams(1, 1, temperature, top_p)
    picks, reference = [], []
    for seed in range(3):
        logits = random_logits(rows, vocab, seed)
        picks.append(sample_next(logits, params, torch.Generator().manual_seed(seed)))
        reference.append(previous_sample_next(logits, params, torch.Generator().manual_seed(seed)))
    picks, reference = torch.cat(picks), torch.cat(reference)
    assert torch.equal(picks, reference), (picks != reference).nonzero()
    # the rows drew many different tokens, most of them outside the first block
    assert len(set(picks.tolist())) > rows and (picks >= 256).float().mean() > 0.5


def test_block_edges_and_partial_last_block_pick_as_the_float64_cumsum():
    """Uniform numbers on and next to every block edge, with a small block (4) over a vocabulary of 10 (a last
    block of 2): the pick of one float64 cumulative sum, where zero-probability entries take no width."""
    probs = torch.tensor([[0.1, 0.0, 0.2, 0.1, 0.0, 0.0, 0.0, 0.0, 0.3, 0.3],
                          [0.0, 0.0, 0.0, 0.0, 0.25, 0.25, 0.0, 0.25, 0.0, 0.25]])
    uniform = torch.cat([torch.linspace(0, 1, 101, dtype=torch.float64)[:-1],
                         torch.tensor([1 - 2**-53, 0.4 - 1e-12, 0.4 + 1e-12, 0.5 - 1e-12, 0.75 + 1e-12],
                                      dtype=torch.float64)])
    for row in probs:
        rows = row.repeat(len(uniform), 1)
        cdf = rows.double().cumsum(-1)
        total = cdf[:, -1:]
        target = torch.minimum(uniform[:, None] * total, torch.nextafter(total, torch.zeros_like(total)))
        want = torch.searchsorted(cdf, target, right=True).squeeze(-1)
        got = inverse_cdf(rows, uniform, block=4)
        assert torch.equal(got, want)
        assert (rows.gather(1, got[:, None]) > 0).all()


def test_a_target_past_its_blocks_own_cumulative_sum_stays_in_the_block():
    """A block's sum and its own cumulative sum add in different orders: where the sum is a rounding larger, a
    target between the two must still pick inside the block (here the next block has probability 0)."""
    generator = torch.Generator().manual_seed(0)
    for _ in range(200):
        block = (torch.rand(1, 256, generator=generator) ** 40).float()  # a wide range of exponents
        block[0, torch.randint(256, (1,), generator=generator)] = 1.0
        if block.double().sum() > block.double().cumsum(-1)[0, -1]:
            break
    else:
        pytest.fail("no block whose sum rounds above its cumulative sum")
    probs = torch.cat([block, torch.zeros(1, 256)], dim=1)
    uniform = 1 - torch.tensor([2**-53, 2**-52, 2**-51], dtype=torch.float64)
    picks = inverse_cdf(probs.repeat(3, 1), uniform)
    assert (picks < 256).all() and (probs[0, picks] > 0).all()


# 400k draws over the 8 tokens of non-zero probability (7 degrees of freedom, alpha = 1e-3: chi-square > 24.32 fails):
# a sampler that gives one token of probability >= 0.05 5 % more (or less) than the softmax, the rest scaled to
# match, has a non-centrality of 400k x 0.0025 p / (1 - p) >= 58 and fails with power >= 0.999 (scipy.stats.ncx2);
# the two -inf tokens must never come up
DRAWS = 400_000
CHI2_7_DOF_ALPHA_1E3 = 24.32
DIST_LOGITS = [2.0, 0.5, -1.0, 1.0, float("-inf"), 0.0, -3.0, 1.5, float("-inf"), -0.5]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_samples_follow_the_softmax(monkeypatch, temperature):
    """Blocks of 4 over the 10 tokens (two whole blocks and a last one of 2): both levels and the partial block."""
    monkeypatch.setattr(hf, "SAMPLING_BLOCK", 4)
    logits = torch.tensor(DIST_LOGITS).repeat(DRAWS, 1)
    ids = sample_next(logits, SamplingParams(1, 1, temperature, 1.0), torch.Generator().manual_seed(11))
    counts = torch.bincount(ids, minlength=len(DIST_LOGITS)).double()
    want = torch.softmax(torch.tensor(DIST_LOGITS, dtype=torch.float64) / temperature, -1)
    assert counts[want == 0].sum() == 0
    expected = DRAWS * want[want > 0]
    chi2 = ((counts[want > 0] - expected) ** 2 / expected).sum()
    assert chi2 < CHI2_7_DOF_ALPHA_1E3, (counts / DRAWS, want)


def test_a_biased_sampler_fails_the_chi_square():
    """The test above can fail: one token of probability 0.055 given 5 % more, at the same number of draws."""
    want = torch.softmax(torch.tensor(DIST_LOGITS, dtype=torch.float64), -1)
    others = (want > 0) & (torch.arange(len(want)) != 5)
    biased = want.clone()
    biased[5] *= 1.05
    biased[others] *= (1 - biased[5]) / want[others].sum()
    assert abs(float(biased.sum()) - 1) < 1e-12
    ids = torch.multinomial(biased.float(), DRAWS, replacement=True, generator=torch.Generator().manual_seed(2))
    counts = torch.bincount(ids, minlength=len(DIST_LOGITS)).double()
    expected = DRAWS * want[want > 0]
    assert ((counts[want > 0] - expected) ** 2 / expected).sum() > CHI2_7_DOF_ALPHA_1E3


@pytest.mark.parametrize("top_p", [1.0, 0.9])
def test_zero_probability_tokens_are_never_sampled(top_p):
    """Logits -inf on all but 3 entries of each row of 49252 (one of them ~1e-31 of the mass, in every other row the
    last entry, in the partial last block), and the extreme uniform numbers 0 and 1 - 2^-53."""
    rows, vocab = 128, 49152 + 100
    generator = torch.Generator().manual_seed(0)
    allowed = torch.stack([torch.randperm(vocab - 1, generator=generator)[:3] for _ in range(rows)])
    allowed[::2, 2] = vocab - 1
    logits = torch.full((rows, vocab), float("-inf"))
    logits.scatter_(1, allowed, torch.tensor([0.0, 1.0, -69.0]).repeat(rows, 1))
    params = SamplingParams(1, 1, 1.0, top_p)
    picks = sample_next(logits, params, torch.Generator().manual_seed(1))
    assert (picks[:, None] == allowed).any(-1).all()
    for u in (0.0, 1 - 2**-53):
        edge = hf.sample_with_uniform(logits, params, torch.full((rows,), u, dtype=torch.float64))
        assert (edge[:, None] == allowed).any(-1).all()
    # u = 0 picks the first entry of non-zero probability, the one of ~1e-31 too where it comes first (top_p 0.9
    # drops it); u = 1 - 2^-53 the last of the two large ones (1e-16 of the mass is more than the tiny one's)
    kept = allowed[:, :2] if top_p < 1 else allowed
    first = hf.sample_with_uniform(logits, params, torch.zeros(rows, dtype=torch.float64))
    last = hf.sample_with_uniform(logits, params, torch.full((rows,), 1 - 2**-53, dtype=torch.float64))
    assert torch.equal(first, kept.min(-1).values) and torch.equal(last, allowed[:, :2].max(-1).values)
    assert (first == allowed[:, 2]).any() == (top_p == 1)


def common_tokens(rows: list[list[int]], count: int) -> tuple[int, ...]:
    counts = torch.bincount(torch.tensor([t for row in rows for t in row]))
    return tuple(counts.argsort(descending=True)[:count].tolist())


@pytest.mark.parametrize("temperature, top_p", [(1.0, 1.0), (0.7, 0.9), (0.0, 1.0)])
def test_tokens_do_not_depend_on_the_stop_check_interval(model, temperature, top_p):
    max_new = 24
    free = generate_hf(model, PROMPTS, SamplingParams(4, max_new, temperature, top_p, ()), PAD,
                       torch.Generator().manual_seed(5))
    # the response's second most common token ends it: rows stop at many different steps, some never
    stop = common_tokens(free.token_ids, 2)[1:]
    params = SamplingParams(4, max_new, temperature, top_p, stop)
    runs = {k: generate_hf(model, PROMPTS, params, PAD, torch.Generator().manual_seed(5), check_every=k)
            for k in (1, 2, 16, None)}
    lengths = [len(row) for row in runs[1].token_ids]
    # (greedy: the G samples of a prompt are one)
    assert len(set(lengths)) >= (2 if temperature == 0 else 3), lengths
    assert any(runs[1].truncated) and not all(runs[1].truncated), lengths
    for k, out in runs.items():
        assert out.token_ids == runs[1].token_ids, k
        assert out.truncated == runs[1].truncated, k
    # each row's random numbers do not depend on the other rows either: a row is the run without stop tokens cut at
    # its first stop token
    for row, full in zip(runs[1].token_ids, free.token_ids):
        cut = next((i + 1 for i, t in enumerate(full) if t in stop), max_new)
        assert row == full[:cut]


def test_tokens_equal_the_previous_engine_until_the_first_row_stops(model):
    """Random numbers per output row change the stream only once a row has stopped (the previous engine drew them
    for the running rows only): with no stop token the same tokens; with one, the same up to the first stop."""
    params = SamplingParams(3, 16, 1.0, 1.0, ())
    ours = generate_hf(model, PROMPTS, params, PAD, torch.Generator().manual_seed(9), check_every=16)
    assert ours.token_ids == previous_generate_hf(model, PROMPTS, params, PAD, torch.Generator().manual_seed(9)).token_ids
    stop = common_tokens(ours.token_ids, 1)
    params = SamplingParams(3, 16, 1.0, 1.0, stop)
    ours = generate_hf(model, PROMPTS, params, PAD, torch.Generator().manual_seed(9)).token_ids
    before = previous_generate_hf(model, PROMPTS, params, PAD, torch.Generator().manual_seed(9)).token_ids
    first_stop = min(map(len, before))
    assert first_stop < 16 and [row[:first_stop] for row in ours] == [row[:first_stop] for row in before]
    assert ours != before  # after it, the streams part (else the comparison above proves nothing new)


def decode_batch_sizes(model, monkeypatch) -> list[int]:
    """The batch size of every decode forward (the prefill excluded) of the generate calls that follow."""
    sizes: list[int] = []
    forward = model.forward

    def recording(*args, **kwargs):
        if "logits_to_keep" not in kwargs:
            sizes.append(kwargs["input_ids"].shape[0])
        return forward(*args, **kwargs)

    monkeypatch.setattr(model, "forward", recording)
    return sizes


@pytest.mark.parametrize("k", [1, 4])
def test_stopped_rows_leave_the_batch_only_at_a_host_check(model, monkeypatch, k):
    free = generate_hf(model, PROMPTS, SamplingParams(4, 24, 1.0, 1.0, ()), PAD, torch.Generator().manual_seed(5))
    params = SamplingParams(4, 24, 1.0, 1.0, common_tokens(free.token_ids, 2)[1:])
    sizes = decode_batch_sizes(model, monkeypatch)
    out = generate_hf(model, PROMPTS, params, PAD, torch.Generator().manual_seed(5), check_every=k)
    lengths = [len(row) for row in out.token_ids]
    # decode forward i (i >= 1) follows step i - 1; the host drops the rows stopped by then before it iff i % k == 0
    for i, size in enumerate(sizes, start=1):
        checked = i - i % k
        assert size == sum(n > checked for n in lengths), (i, sizes, lengths)
    # the loop ends at the first check after every row stopped (or at the cap)
    last = max(lengths)
    assert len(sizes) == min(-(-last // k) * k, 24) - 1


def test_the_stop_check_interval_setting():
    assert RolloutConfig().hf_stop_check_every is None
    assert (stop_check_every(None, torch.device("cpu")), stop_check_every(None, torch.device("cuda"))) == (1, 16)
    assert stop_check_every(3, torch.device("cuda")) == 3
    engine = build_generator(rollout_config_from_dict({"hf_stop_check_every": 3}), SimpleNamespace(pad_token_id=0),
                             published=None, device=torch.device("cpu"))
    assert engine.stop_check_every == 3
    with pytest.raises(ConfigError, match="rollout.hf_stop_check_every must be null or >= 1, got 0"):
        rollout_config_from_dict({"hf_stop_check_every": 0})

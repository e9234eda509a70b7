"""The `hf` rollout engine against Hugging Face's own greedy `generate`, with and without the shared prefill."""

from __future__ import annotations

import copy
import warnings
from types import SimpleNamespace

import pytest
import torch

from tokenpo.models.published import Published
from tokenpo.rollout import SamplingParams, build_generator
from tokenpo.rollout.config import RolloutConfig

PAD = 0
# LlamaConfig's default EOS id: Hugging Face's generate stops on it unless told otherwise
EOS = 2
PROMPTS = [[5, 17, 33], [9, 41, 8, 60, 12, 71, 3], [88, 14, 27, 50, 6]]
MAX_NEW = 12


def hf_greedy(model, prompts, max_new, stop):
    """Hugging Face's generate on the same left-padded batch; rows cut after their first stop token."""
    width = max(map(len, prompts))
    ids = torch.tensor([[PAD] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new, do_sample=False,
                         pad_token_id=PAD, eos_token_id=list(stop))
    rows = []
    for row in out[:, width:].tolist():
        ends = [i for i, t in enumerate(row) if t in stop]
        rows.append(row[: ends[0] + 1] if ends else row)
    return rows


def run(model, prompts, params, seed=0):
    engine = build_generator(RolloutConfig(engine="hf"), SimpleNamespace(pad_token_id=PAD), Published.of_module(model),
                             torch.device("cpu"))
    return engine.sample(prompts, params, torch.Generator().manual_seed(seed))


def greedy(num_samples, share_prefill, stop=(EOS,), max_new=MAX_NEW):
    return SamplingParams(num_samples, max_new, 0.0, 1.0, tuple(stop), share_prefill)


def test_greedy_matches_hf_generate_token_for_token(model):
    ours = run(model, PROMPTS, greedy(1, True))
    assert ours.token_ids == hf_greedy(model, PROMPTS, MAX_NEW, {EOS})
    assert all(len(row) >= 1 for row in ours.token_ids)


def test_shared_prefill_equals_repeated_prompts(model):
    shared = run(model, PROMPTS, greedy(3, True))
    repeated = run(model, PROMPTS, greedy(3, False))
    single = run(model, PROMPTS, greedy(1, True))
    assert shared.token_ids == repeated.token_ids
    assert shared.truncated == repeated.truncated
    # prompt-major order: rows i*G .. i*G+G-1 are prompt i's samples, all equal under greedy decoding
    assert shared.token_ids == [row for row in single.token_ids for _ in range(3)]


def test_stop_token_ends_its_row_and_sets_truncated(model):
    free = run(model, PROMPTS, greedy(1, True, stop=(), max_new=MAX_NEW))
    assert all(len(row) == MAX_NEW for row in free.token_ids) and all(free.truncated)
    # a token greedy decoding writes mid-way through prompt 1's response becomes a stop token
    stop_token = free.token_ids[1][4]
    cut = free.token_ids[1].index(stop_token)
    stopped = run(model, PROMPTS, greedy(1, True, stop=(stop_token,)))
    expected = []
    for row in free.token_ids:
        expected.append(row[: row.index(stop_token) + 1] if stop_token in row else row)
    assert stopped.token_ids == expected
    assert stopped.token_ids[1] == free.token_ids[1][: cut + 1]
    assert stopped.truncated == [stop_token not in row for row in free.token_ids]
    assert stopped.token_ids == hf_greedy(model, PROMPTS, MAX_NEW, {stop_token})


def test_same_generator_seed_gives_same_samples(model):
    params = SamplingParams(4, 8, 1.0, 1.0, (), True)
    first, again, other = run(model, PROMPTS, params, 7), run(model, PROMPTS, params, 7), run(model, PROMPTS, params, 8)
    assert first.token_ids == again.token_ids
    assert first.token_ids != other.token_ids
    # temperature-1 samples of a random model differ between the G samples of one prompt
    assert len({tuple(row) for row in first.token_ids[:4]}) > 1


def test_tiny_top_p_keeps_only_the_argmax(model):
    nucleus = run(model, PROMPTS, SamplingParams(2, MAX_NEW, 1.0, 1e-6, (EOS,), True), seed=5)
    assert nucleus.token_ids == run(model, PROMPTS, greedy(2, True)).token_ids


@pytest.mark.filterwarnings("error")
def test_sampling_warns_nothing(model):
    """The KV cache goes in under the keyword this transformers release takes (`past_key_values` warns in 5.x)."""
    assert len(run(model, PROMPTS, SamplingParams(2, 3, 1.0, 1.0, (), True)).token_ids) == 2 * len(PROMPTS)


@pytest.mark.filterwarnings("error")
def test_a_lora_policy_generates_with_its_adapters(model):
    """A PEFT-wrapped policy decodes as its merged model does (and not as the base model), with no warning."""
    from peft import LoraConfig, get_peft_model

    with warnings.catch_warnings():  # what PEFT's wrapping itself warns is not the engine's
        warnings.simplefilter("ignore")
        policy = get_peft_model(copy.deepcopy(model), LoraConfig(r=2, lora_alpha=16, target_modules="all-linear",
                                                                 init_lora_weights=False))
        merged = copy.deepcopy(policy).merge_and_unload()
    params = greedy(2, True)
    adapted = run(policy, PROMPTS, params)
    assert adapted.token_ids == run(merged, PROMPTS, params).token_ids
    assert adapted.token_ids != run(model, PROMPTS, params).token_ids
    with policy.disable_adapter():
        assert run(policy, PROMPTS, params).token_ids == run(model, PROMPTS, params).token_ids

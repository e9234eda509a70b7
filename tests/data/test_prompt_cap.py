"""data.max_prompt_tokens on the arith curriculum with the SmolLM2 tokenizer: what is dropped, truncated or refused.

Rendered with arith's chat template, 72 of the 120 training prompts are 38 tokens long and 48 are 40; of the 64
held-out prompts 38 are 38 tokens and 26 are 40. A cap of 39 therefore splits both splits.
"""

import logging

import pytest

from tokenpo.data import data_config_from_dict, load_splits
from tokenpo.data.prompts import capped_prompt_ids, prompt_token_ids
from tokenpo.errors import ConfigError


def arith(**values):
    return data_config_from_dict({"max_prompt_tokens": 39, **values})


def test_drop_removes_the_longer_prompts_and_logs_one_line_per_split(smollm2_tokenizer, caplog):
    cfg = arith()
    with caplog.at_level(logging.INFO, logger="tokenpo.data.loaders"):
        train, held_out = load_splits(cfg, 0, smollm2_tokenizer)
    assert (len(train), len(held_out)) == (72, 38)
    assert {len(prompt_token_ids(ex.problem, smollm2_tokenizer, cfg.template)) for ex in train + held_out} == {38}
    lines = [record.getMessage() for record in caplog.records]
    assert len(lines) == 2
    assert "[train]: kept 72 of 120 rows" in lines[0] and lines[0].endswith("; 48 prompts over 39 tokens (dropped)")
    assert "[test]: kept 38 of 64 rows" in lines[1] and lines[1].endswith("; 26 prompts over 39 tokens (dropped)")
    assert {record.levelname for record in caplog.records} == {"WARNING"}


def test_the_prompt_cap_applies_before_the_example_cap(smollm2_tokenizer):
    train, held_out = load_splits(arith(max_train_examples=60, max_eval_examples=30), 0, smollm2_tokenizer)
    assert (len(train), len(held_out)) == (60, 30)


@pytest.mark.parametrize("mode", ["truncate_left", "truncate_middle"])
def test_truncation_keeps_every_problem_and_cuts_when_encoded(smollm2_tokenizer, caplog, mode):
    cfg = arith(overlong_prompt=mode)
    with caplog.at_level(logging.INFO, logger="tokenpo.data.loaders"):
        train, held_out = load_splits(cfg, 0, smollm2_tokenizer)
    assert (len(train), len(held_out)) == (120, 64)
    assert caplog.records[0].getMessage().endswith(f"; 48 prompts over 39 tokens (kept, {mode} when encoded)")
    full = {ex.uid: prompt_token_ids(ex.problem, smollm2_tokenizer, cfg.template) for ex in train}
    capped = {ex.uid: capped_prompt_ids(ex.problem, smollm2_tokenizer, cfg) for ex in train}
    assert sorted(len(ids) for ids in capped.values()) == [38] * 72 + [39] * 48
    long_uid = next(uid for uid, ids in full.items() if len(ids) == 40)
    expected = full[long_uid][1:] if mode == "truncate_left" else full[long_uid][:19] + full[long_uid][20:]
    assert capped[long_uid] == expected


def test_truncate_left_keeps_the_generation_prompt_and_middle_the_template_head(smollm2_tokenizer):
    problem = "What is 3 + 4?"
    left = capped_prompt_ids(problem, smollm2_tokenizer, arith(max_prompt_tokens=12, overlong_prompt="truncate_left"))
    middle = capped_prompt_ids(problem, smollm2_tokenizer,
                               arith(max_prompt_tokens=12, overlong_prompt="truncate_middle"))
    # 38 tokens cut to 12: the end of the question and the assistant header, or the first 6 and last 6 tokens
    assert smollm2_tokenizer.decode(left) == " 3 + 4?<|im_end|>\n<|im_start|>assistant\n"
    assert smollm2_tokenizer.decode(middle) == "<|im_start|>system\nYou are a<|im_end|>\n<|im_start|>assistant\n"


def test_error_refuses_at_load_time_naming_the_count(smollm2_tokenizer):
    with pytest.raises(ConfigError, match=r"^data.max_prompt_tokens=39: 48 of 120 prompts of arith\(.*\) \[train\] "
                                          r"are longer \(longest 40 tokens\); raise it or set data.overlong_prompt"):
        load_splits(arith(overlong_prompt="error"), 0, smollm2_tokenizer)
    train, _ = load_splits(arith(overlong_prompt="error", max_prompt_tokens=40), 0, smollm2_tokenizer)
    assert len(train) == 120


def test_a_cap_needs_the_tokenizer_and_zero_or_null_is_no_cap(smollm2_tokenizer):
    with pytest.raises(ConfigError, match=r"^data.max_prompt_tokens is set but the data was loaded without"):
        load_splits(arith(), 0)
    for no_cap in (0, None):
        train, held_out = load_splits(arith(max_prompt_tokens=no_cap), 0)
        assert (len(train), len(held_out)) == (120, 64)
    problem = "What is 3 + 4?"
    assert capped_prompt_ids(problem, smollm2_tokenizer, arith(max_prompt_tokens=0)) == prompt_token_ids(
        problem, smollm2_tokenizer, arith().template)


def test_a_dropped_prompt_that_reaches_encoding_is_an_error_not_a_silent_cut(smollm2_tokenizer):
    with pytest.raises(ValueError, match=r"a 40-token prompt is over data.max_prompt_tokens=39 but "
                                         r"data.overlong_prompt is 'drop'"):
        long_problem = next(ex.problem for ex in load_splits(data_config_from_dict({}), 0)[0]
                            if len(prompt_token_ids(ex.problem, smollm2_tokenizer, arith().template)) == 40)
        capped_prompt_ids(long_problem, smollm2_tokenizer, arith())

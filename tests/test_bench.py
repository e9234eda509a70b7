"""`python -m tokenpo.bench`: the result JSON of a real 2-step tiny run, the statistics it reports, the settings
it refuses, what TRL is fed; and that the speed-ups it measures keep results (length buckets, inverse-CDF sampling)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch


from support.cli import env_without_progress_settings
from tokenpo.bench.settings import BenchSettings, hydra_overrides, train_config
from tokenpo.bench.stats import PHASES, PeakMemory, forward_flops, summarise
from tokenpo.errors import ConfigError
from tokenpo.models.logprobs import length_buckets
from tokenpo.rollout.engine import SamplingParams
from tokenpo.rollout.hf import sample_next

REPO = Path(__file__).resolve().parents[1]
SHAPE = {"non_embedding_params": 1000, "hidden_size": 4, "vocab_size": 10}


def step(step_s, update, tokens, prompt_tokens=10, **phases):
    out = {p: 0.0 for p in PHASES} | {"step_s": step_s, "step_cpu_s": 2 * step_s, "update": update,
                                      "completion_tokens": tokens, "prompt_tokens": prompt_tokens}
    return out | phases


def test_summarise_drops_each_runs_warmup_step_and_pools_the_rest():
    runs = [{"steps": [step(99.0, 50.0, 7), step(4.0, 2.0, 40), step(6.0, 3.0, 20)],
             "peak_rss_mb": {"process": 700.0, "total": 900.0}},
            {"steps": [step(88.0, 40.0, 7), step(5.0, 1.0, 30, generate=2.5)],
             "peak_rss_mb": {"process": 650.0, "total": 1200.0}}]
    out = summarise(runs, SHAPE)
    assert out["step_s"] == [4.0, 6.0, 5.0]
    assert out["median_step_s"] == 5.0 and out["median_step_cpu_s"] == 10.0
    assert out["phases_s"]["update"] == 2.0 and out["phases_s"]["generate"] == 0.0
    assert out["completion_tokens_per_s"] == pytest.approx(90 / 15)
    assert out["completion_tokens_per_step"] == 30
    assert out["peak_rss_mb"] == 1200.0 and out["peak_rss_process_mb"] == 700.0 and out["measured_steps"] == 3
    # forward = 2 x 1000 x (10 + n) + 2 x 4 x 10 x n per step; update = 3 x forward over 6 s of updates
    forward = sum(2 * 1000 * (10 + n) + 80 * n for n in (40, 20, 30))
    assert out["update_gflops_per_s"] == pytest.approx(3 * forward / 6.0 / 1e9)
    assert out["reference_gflops_per_s"] is None
    # only the last run's measured step generated (2.5 s): 90 tokens over it; no weight sync (the hf engine)
    assert out["generation_tokens_per_s"] == pytest.approx(90 / 2.5)
    assert out["weight_sync_frac"] == 0.0


def test_summarise_reports_the_weight_sync_share_of_the_steps():
    runs = [{"steps": [step(9.0, 1.0, 5), step(4.0, 2.0, 40, generate=2.0, weight_sync=0.2),
                       step(6.0, 3.0, 20, generate=1.0, weight_sync=0.4)], "peak_rss_mb": {"process": 1.0, "total": 1.0}}]
    out = summarise(runs, SHAPE)
    assert out["weight_sync_frac"] == pytest.approx(0.6 / 10.0)
    assert out["generation_tokens_per_s"] == pytest.approx(60 / 3.0)
    assert out["phases_s"]["weight_sync"] == pytest.approx(0.3)


def test_summarise_reports_the_overlap_and_the_generators_own_speed_when_generation_runs_ahead():
    ahead = {"generator": 3.0, "generator_wait_weights": 1.0, "trainer_wait_rollouts": 0.5, "trainer_wait_weights": 0.1}
    runs = [{"steps": [step(9.0, 1.0, 5, **ahead), step(4.0, 2.0, 40, generate=0.5, **ahead),
                       step(6.0, 3.0, 20, generate=0.5, **ahead | {"generator": 5.0})],
             "peak_rss_mb": {"process": 1.0, "total": 1.0}}]
    out = summarise(runs, SHAPE)
    # tokens over the generator process's seconds, not over the trainer's wait (its "generate")
    assert out["generation_tokens_per_s"] == pytest.approx(60 / 8.0)
    assert out["ahead_s"] == {"generator": 4.0, "generator_wait_weights": 1.0, "trainer_wait_rollouts": 0.5,
                              "trainer_wait_weights": 0.1}
    assert summarise([{"steps": [step(9.0, 1.0, 5), step(4.0, 2.0, 40, generate=2.0)],
                       "peak_rss_mb": {"process": 1.0, "total": 1.0}}], SHAPE)["ahead_s"] == {}


def test_forward_flops_counts_the_head_on_completion_tokens_only():
    assert forward_flops(prompt_tokens=5, completion_tokens=0, shape=SHAPE) == 2 * 1000 * 5
    assert forward_flops(prompt_tokens=0, completion_tokens=3, shape=SHAPE) == 2 * 1000 * 3 + 2 * 4 * 10 * 3


def test_summarise_needs_a_measured_step():
    with pytest.raises(ValueError, match="no measured steps"):
        summarise([{"steps": [step(1.0, 1.0, 1)], "peak_rss_mb": {"process": 1.0, "total": 1.0}}], SHAPE)


def test_peak_memory_counts_children_that_already_exited():
    import psutil

    with PeakMemory(interval_s=0.02) as memory:
        # a child holding 150 MB for a while, like tokenpo's reward workers
        holder = "import time; b = bytearray(150 * 2**20); b[::4096] = b'x' * len(b[::4096]); time.sleep(0.5)"
        subprocess.run([sys.executable, "-c", holder], check=True)
    own_now = psutil.Process().memory_info().rss / 2**20
    report = memory.report()
    assert report["tree"] >= own_now + 140
    assert report["total"] == max(report["tree"], report["process"]) and report["process"] >= own_now * 0.9


@pytest.mark.parametrize("settings, message", [
    (BenchSettings(model="gpt2"), "--model must be one of smollm2_135m, tiny"),
    (BenchSettings(engine="sglang"), "--engine must be one of hf, vllm, got 'sglang'"),
    (BenchSettings(group_size=1), "--group-size must be >= 2, got 1"),
    (BenchSettings(steps=1), "--steps must be >= 2"),
    (BenchSettings(prompts=0), "--prompts must be >= 1, got 0"),
    (BenchSettings(overrides=("rollout.share_prefill",)), "--override takes key=value"),
    (BenchSettings(micro_batch_size=6), "--micro-batch-size must be a multiple of --group-size=4"),
    (BenchSettings(micro_batch_size=12), "divides prompts x group size = 32"),
])
def test_bad_settings_are_refused_in_one_line(settings, message):
    with pytest.raises(ConfigError, match=message):
        settings.validate()


def test_settings_compose_the_trainers_config_without_evaluation():
    cfg, _ = train_config(BenchSettings(model="tiny", prompts=3, group_size=5, max_new_tokens=7, beta=0.0, lr=3e-6,
                                        overrides=("rollout.share_prefill=false",)))
    assert (cfg.data.prompts_per_step, cfg.rollout.group_size, cfg.rollout.max_new_tokens) == (3, 5, 7)
    assert cfg.algorithm.loss.kl_coef == 0.0 and cfg.trainer.lr == 3e-6 and cfg.trainer.warmup_steps == 0
    assert cfg.data.eval_split is None and cfg.logger.mode == "disabled" and cfg.rollout.share_prefill is False
    # the micro-batch is at most one step's 3 x 5 sequences
    assert cfg.trainer.micro_batch_size == 15
    with pytest.raises(ConfigError, match="does not compose"):
        train_config(BenchSettings(overrides=("rollout.no_such_key=1",)))


def test_length_buckets_minimise_padding_plus_a_cost_per_bucket():
    lengths = [0, 5, 100, 6, 98]
    # one bucket: 4 x 100 + 10 = 410; every row alone: 209 + 40 = 249; {5, 6} and {98, 100}: 12 + 200 + 20 = 232
    assert length_buckets(lengths, overhead_tokens=10) == [[1, 3], [4, 2]]
    # a bucket that costs nothing: no padding at all
    assert length_buckets(lengths, overhead_tokens=0) == [[1], [3], [4], [2]]
    # a very costly bucket: everything in one (the empty row is never run)
    assert length_buckets(lengths, overhead_tokens=10_000) == [[1, 3, 4, 2]]
    assert length_buckets([0, 0]) == []


def sample_frequencies(logits_row, params, draws=40_000, seed=0):
    logits = torch.tensor(logits_row).repeat(draws, 1)
    ids = sample_next(logits, params, torch.Generator().manual_seed(seed))
    return torch.bincount(ids, minlength=len(logits_row)).double() / draws


@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_inverse_cdf_sampling_draws_from_the_softmax(temperature):
    logits = [2.0, 0.0, -1.0, 1.0, -30.0]
    freq = sample_frequencies(logits, SamplingParams(1, 1, temperature, 1.0))
    want = torch.softmax(torch.tensor(logits, dtype=torch.float64) / temperature, -1)
    # 5 binomial standard deviations of 40k draws
    tolerance = 5 * torch.sqrt(want * (1 - want) / 40_000) + 1e-4
    assert ((freq - want).abs() <= tolerance).all(), (freq, want)


def test_nucleus_sampling_never_draws_outside_the_nucleus():
    # probabilities ~ [0.64, 0.24, 0.09, 0.03]: top_p 0.8 keeps the first two, renormalised
    logits = [3.0, 2.0, 1.0, 0.0]
    freq = sample_frequencies(logits, SamplingParams(1, 1, 1.0, 0.8))
    p = torch.softmax(torch.tensor(logits, dtype=torch.float64), -1)
    assert freq[2] == 0 and freq[3] == 0
    assert abs(freq[0] - p[0] / (p[0] + p[1])) < 0.01


def test_samples_follow_the_generator_seed():
    logits = torch.zeros(64, 50)
    params = SamplingParams(1, 1, 1.0, 1.0)
    first, again = (sample_next(logits, params, torch.Generator().manual_seed(3)) for _ in range(2))
    assert torch.equal(first, again)
    assert not torch.equal(first, sample_next(logits, params, torch.Generator().manual_seed(4)))


def test_trl_gets_tokenpos_exact_chat_prompts():
    from tokenpo.bench.run_trl import check_same_prompt_ids, chat_messages
    from tokenpo.bench.settings import step_examples
    from tokenpo.data import PromptTemplate, build_prompt
    from tokenpo.models.loading import load_model

    cfg, _ = train_config(BenchSettings(model="tiny"))
    tokenizer, _ = load_model(cfg.model, 0)
    examples = step_examples(cfg, 1)[0]
    check_same_prompt_ids(examples, tokenizer, cfg.data.template)
    with_system = PromptTemplate(mode="chat", system_prompt="Be brief.", instruction=" Box it.")
    rendered = tokenizer.apply_chat_template(chat_messages("What is 2 + 3?", with_system), tokenize=False,
                                             add_generation_prompt=True)
    assert rendered == build_prompt("What is 2 + 3?", tokenizer, with_system)
    assert "Be brief." in rendered and "What is 2 + 3? Box it." in rendered


def test_trl_reward_is_tokenpos_verdict():
    from tokenpo.bench.run_trl import reward_function

    cfg, _ = train_config(BenchSettings(model="tiny"))
    reward = reward_function(cfg.reward_for(cfg.data))
    completions = [[{"role": "assistant", "content": r}] for r in ("so \\boxed{12}", "it is 11", "no idea", "12")]
    assert reward(completions, ["12", "12", "12", "12"]) == [1.0, 0.0, 0.0, 1.0]


@pytest.mark.e2e
def test_bench_cli_writes_the_result_json_of_a_real_tiny_run(tmp_path):
    out = tmp_path / "bench.json"
    cmd = [sys.executable, "-m", "tokenpo.bench", "--model", "tiny", "--steps", "2", "--prompts", "2",
           "--group-size", "2", "--max-new-tokens", "4", "--threads", "1", "--override", "reward.num_workers=1",
           "--out", str(out)]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["settings"] | {"overrides": []} == BenchSettings(model="tiny", steps=2, prompts=2, group_size=2,
                                                                   max_new_tokens=4, threads=1).to_dict()
    assert report["machine"]["cpus"] >= 1 and report["machine"]["matmul_gflops_per_s"] > 0
    assert "trl" not in report and "tokenpo_over_trl" not in report
    result = report["tokenpo"]
    (run,) = result["runs"]
    assert run["framework"] == "tokenpo" and run["threads_used"] == 1 and len(run["steps"]) == 2
    measured = run["steps"][1]
    # one measured step: the medians are that step's numbers
    assert result["median_step_s"] == measured["step_s"] and result["measured_steps"] == 1
    assert result["median_step_cpu_s"] == measured["step_cpu_s"] > 0
    assert set(result["phases_s"]) == set(PHASES)
    assert all(result["phases_s"][p] == measured[p] for p in PHASES)
    assert result["phases_s"]["generate"] > 0 and result["phases_s"]["reference"] > 0  # beta 0.04: a reference pass
    assert result["phases_s"]["old_logprob"] == 0  # on-policy: no old-logprob pass
    split = measured["policy_forward"] + measured["backward"] + measured["optimizer"]
    assert math.isclose(split, measured["update"], rel_tol=1e-9)
    assert min(measured["backward"], measured["optimizer"], measured["policy_forward"]) > 0
    assert sum(measured[p] for p in ("generate", "reward", "reference", "update")) <= measured["step_s"]
    assert 2 * 2 <= measured["completion_tokens"] <= 2 * 2 * 4 and measured["prompt_tokens"] > 0
    assert result["completion_tokens_per_s"] == pytest.approx(measured["completion_tokens"] / measured["step_s"])
    assert result["peak_rss_mb"] == run["peak_rss_mb"]["total"] > 100
    assert "tokenpo" in done.stdout and "median step" in done.stdout


@pytest.mark.e2e
def test_a_piped_bench_shows_no_library_bar(tmp_path):
    """A model loaded from a folder makes transformers draw its "Loading weights" bar; through a pipe (a log file,
    `tee`) the bench and its workers keep every library bar off, as tokenpo.train does."""
    from tokenpo.models.config import ModelConfig
    from tokenpo.models.loading import load_model

    tokenizer, model = load_model(ModelConfig(name="tiny", source="tiny"))
    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    cmd = [sys.executable, "-m", "tokenpo.bench", "--model", "smollm2_135m", "--steps", "2", "--prompts", "2",
           "--group-size", "2", "--max-new-tokens", "4", "--threads", "1", "--override", "reward.num_workers=1",
           "--override", "model.source=local", "--override", f"model.path={tmp_path / 'model'}",
           "--out", str(tmp_path / "bench.json")]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=240,
                          env=env_without_progress_settings())
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Loading weights" not in done.stderr and "%|" not in done.stderr, done.stderr[-3000:]


def test_the_engine_option_picks_tokenpos_rollout_config_group():
    assert "rollout=hf" in hydra_overrides(BenchSettings())
    assert "rollout=vllm" in hydra_overrides(BenchSettings(engine="vllm"))


def test_lora_ranks_are_one_override_each_and_refuse_a_second_rank_override():
    from tokenpo.bench.cli import lora_variants

    settings = BenchSettings(model="tiny", overrides=("model.lora.alpha=16",))
    variants = lora_variants(settings, [0, 1, 8])
    assert [v.overrides for v in variants] == [("model.lora.alpha=16", f"model.lora.rank={r}") for r in (0, 1, 8)]
    ranks = [train_config(v)[0].model.lora for v in variants]
    assert [(lora.rank, lora.alpha) for lora in ranks] == [(0, 16), (1, 16), (8, 16)]
    assert lora_variants(settings, None) == [settings]
    with pytest.raises(ConfigError, match="--lora-ranks sets model.lora.rank itself"):
        lora_variants(BenchSettings(overrides=("model.lora.rank=4",)), [0, 8])


def test_trl_trains_the_same_lora_adapters_with_the_base_as_reference(tmp_path):
    """--vs-trl with model.lora.rank: TRL's policy has tokenpo's adapters (same modules, rank, alpha, dropout, same
    trainable parameters) and no second model for the KL reference."""
    from tokenpo.bench.run_trl import adapters_off, grpo_trainer, pretrained_dir
    from tokenpo.models.loading import load_model

    settings = BenchSettings(model="tiny", prompts=2, group_size=2, max_new_tokens=4, steps=2,
                             overrides=("model.lora.rank=4", "model.lora.alpha=8", "model.lora.dropout=0.05"))
    cfg, _ = train_config(settings)
    tokenizer, ours = load_model(cfg.model, cfg.seed)
    _, base = load_model(train_config(BenchSettings(model="tiny"))[0].model, cfg.seed)
    rows = [{"prompt": [{"role": "user", "content": "1 + 1?"}], "answer": "2"}] * 4
    trainer = grpo_trainer(settings, cfg, tokenizer, pretrained_dir(cfg, tokenizer, base, str(tmp_path)), rows,
                           str(tmp_path / "trl"))
    theirs = trainer.model
    assert trainer.ref_model is None and trainer.beta == settings.beta > 0
    config = theirs.peft_config["default"]
    assert (config.r, config.lora_alpha, config.lora_dropout) == (4, 8, 0.05)
    trainable = {n: p.shape for n, p in theirs.named_parameters() if p.requires_grad}
    assert trainable == {n: p.shape for n, p in ours.named_parameters() if p.requires_grad}
    assert len(trainable) == 2 * 7 * cfg.model.tiny.num_layers  # A and B of every linear layer of every block
    assert not adapters_off(theirs)
    with theirs.disable_adapter():
        assert adapters_off(theirs)


@pytest.mark.e2e
def test_bench_cli_measures_full_and_lora_ranks_in_one_run(tmp_path):
    out = tmp_path / "bench.json"
    cmd = [sys.executable, "-m", "tokenpo.bench", "--model", "tiny", "--steps", "2", "--prompts", "2",
           "--group-size", "2", "--max-new-tokens", "4", "--threads", "1", "--override", "reward.num_workers=1",
           "--lora-ranks", "0", "2", "--out", str(out)]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert "tokenpo" not in report and [row["rank"] for row in report["lora_ranks"]] == [0, 2]
    full, lora = report["lora_ranks"]
    # the trainer's own count of the adapter parameters is the memory plan's
    assert lora["tokenpo"]["runs"][0]["shape"]["trainable_params"] == lora["plan"]["trainable_params"]
    assert full["tokenpo"]["runs"][0]["shape"]["trainable_params"] > 10 * lora["plan"]["trainable_params"]
    for row in (full, lora):
        (run,) = row["tokenpo"]["runs"]
        assert row["tokenpo"]["measured_steps"] == 1 and row["tokenpo"]["median_step_s"] > 0
        assert row["tokenpo"]["peak_rss_process_mb"] == run["peak_rss_mb"]["process"] > 100
        # beta 0.04: a reference pass in both (LoRA: the policy with its adapters off)
        assert row["tokenpo"]["phases_s"]["reference"] > 0
    # layers x rank x (fan-in + fan-out) of the 4 attention (64 -> 64) and 3 MLP (64 <-> 128) projections
    assert lora["plan"]["trainable_params"] == 2 * 2 * (4 * (64 + 64) + 3 * (64 + 128))
    assert lora["plan"]["state_mb"] < full["plan"]["state_mb"] / 3
    lines = done.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("rank | trainable | plan state MB"))
    assert lines[header + 1].startswith("full | ") and lines[header + 2].startswith("2 | 4,352 | ")

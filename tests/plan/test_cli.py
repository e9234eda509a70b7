"""`python -m tokenpo.plan`: the overrides of tokenpo.train, text and JSON output, suggestions that fit."""

from __future__ import annotations

import json

import pytest

from tokenpo.plan.cli import compose_train_config, main
from tokenpo.plan.memory import build_plan, device_type, host_memory
from tokenpo.plan.units import parse_bytes

TINY_PARAMS = 98_816  # 259 x 64 embeddings (tied; the built-in byte tokenizer) + 2 x 41088 per layer + 64


def plan_json(capsys, *argv: str) -> dict:
    main([*argv, "--json"])
    return json.loads(capsys.readouterr().out)


def test_json_holds_the_total_and_every_part(capsys):
    out = plan_json(capsys, "model=tiny", "--prompt-tokens", "40")
    parts = out["parts"]
    assert out["parameters"] == TINY_PARAMS
    assert parts["policy weights"]["bytes"] == 4 * TINY_PARAMS
    # one micro-batch per step at ZeRO 0: beside the activations only the output layer's gradient (259 x 64, fp32)
    assert parts["gradients"]["bytes"] == 259 * 64 * 4
    assert parts["optimizer states"]["bytes"] == 8 * TINY_PARAMS
    assert parts["fp32 master weights"]["bytes"] == 0
    assert parts["KL reference"]["bytes"] == 4 * TINY_PARAMS  # GRPO's beta = 0.04
    by_phase = {phase: sum(p["bytes"] for p in parts.values() if p["phase"] == phase)
                for phase in ("always", "generation", "update")}
    assert out["total_bytes"] == by_phase["always"] + max(by_phase["generation"], by_phase["update"])
    assert out["shapes"] == {"world": 1, "prompt_tokens": 40, "new_tokens": 32, "rollout_rows": 32, "micro_rows": 32,
                             "micro_groups": 8, "micro_batches": 1}
    # planned for this machine's device and its memory (the RAM on CPU): a verdict without --device-memory
    assert out["device"] == device_type() and out["fits"] is True
    if out["device"] == "cpu":
        assert out["device_memory_bytes"] == host_memory() and out["memory_from"] == "this machine's RAM"


def test_a_borrowed_tokenizer_sizes_the_tiny_models_embeddings(capsys):
    out = plan_json(capsys, "model=tiny", "model.tokenizer_from=smollm2_135m")
    # 49152 x 64 embeddings (tied; SmolLM2's vocabulary, from conf/model/configs/smollm2_135m.json) + 2 x 41088 + 64
    assert out["parameters"] == 3_227_968
    assert out["parts"]["policy weights"]["bytes"] == 4 * 3_227_968


def test_zero_stage_and_processes_shard_the_states(capsys):
    out = plan_json(capsys, "model=tiny", "deepspeed=zero3", "trainer.nproc=2", "algorithm.loss.kl_coef=0")
    parts, half = out["parts"], -(-TINY_PARAMS // 2)
    assert parts["policy weights"]["bytes"] == 4 * half
    # one reduce bucket: deepspeed.reduce_bucket_size elements, at most the parameters it reduces
    assert parts["gradients"]["bytes"] == 4 * (half + min(50_000_000, TINY_PARAMS))
    assert parts["optimizer states"]["bytes"] == 8 * half
    assert parts["fp32 master weights"]["bytes"] == 8 * half
    assert parts["KL reference"]["bytes"] == 0
    assert out["shapes"]["world"] == 2 and out["shapes"]["rollout_rows"] == 16


def test_the_kl_reference_is_planned_in_the_training_dtype(capsys):
    """fp32 weights under bf16 precision: the engine casts the reference to bf16 with the policy (kl/ref 0 at step 0)."""
    out = plan_json(capsys, "model=tiny", "deepspeed.precision=bf16", "--prompt-tokens", "40")
    assert out["parts"]["policy weights"]["bytes"] == 2 * TINY_PARAMS
    assert out["parts"]["KL reference"]["bytes"] == 2 * TINY_PARAMS

def test_the_suggested_change_fits_when_applied(capsys):
    overrides = ["model=tiny", "trainer.micro_batch_size=64", "data.prompts_per_step=16", "rollout.max_new_tokens=256"]
    overrides += ["--device", "cuda", "--prompt-tokens", "512"]  # as build_plan's defaults below
    base = plan_json(capsys, *overrides)["total_bytes"]
    out = plan_json(capsys, *overrides, "--device-memory", str(base - 1))
    assert out["fits"] is False and out["suggestions"]
    for suggestion in out["suggestions"]:
        assert suggestion["total_bytes"] < base
        changed = compose_train_config([*overrides[:-4], *suggestion["change"].split()])
        assert build_plan(changed, 1).total_bytes == suggestion["total_bytes"]
    assert out["suggestions"][0]["change"].startswith("trainer.micro_batch_size=")


def test_text_output_says_whether_it_fits(capsys):
    main(["model=tiny", "--device-memory", "1TiB"])
    text = capsys.readouterr().out
    assert "policy weights" in text and "of 1.00 TiB device memory: fits" in text


def test_paper_setup_plans_offline_from_the_shipped_config(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))  # nothing cached: the shipped config.json serves
    out = plan_json(capsys, "experiment=paper/gtpo_qwen2_5_7b", "--device-memory", "80GiB")
    assert out["parameters"] == 7_615_616_512 and out["architecture"].endswith("conf/model/configs/qwen2_5_7b.json")
    assert out["shapes"]["world"] == 8 and out["shapes"]["prompt_tokens"] == 2048


def test_bad_override_is_one_line(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["trainer.micro_batch_size=0"])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.strip() == "tokenpo.plan: error: trainer.micro_batch_size must be >= 1, got 0"


@pytest.mark.parametrize("text, expected", [("80GiB", 80 * 2**30), ("80GB", 80 * 10**9), ("1.5 MiB", 3 * 2**19),
                                            (1024, 1024), ("2e9", 2 * 10**9)])
def test_byte_counts(text, expected):
    assert parse_bytes(text, "k") == expected


@pytest.mark.parametrize("text", ["lots", "80 parsecs", "-1", "0"])
def test_bad_byte_counts_name_the_key(text):
    with pytest.raises(Exception, match="^trainer.memory_limit must be"):
        parse_bytes(text, "trainer.memory_limit")


def test_without_flags_it_plans_the_run_as_it_would_start_here(capsys):
    """The device detected here, the data's real prompt lengths (82 tokens on the tiny model's byte tokenizer): the
    total the start-up line gives (tests/plan/test_startup.py), not a CUDA device with 512-token prompts."""
    main(["model=tiny"])
    text = capsys.readouterr().out
    assert text.startswith(f"planned for: {device_type()} (detected on this machine), ")
    assert "longest prompt 82 tokens (the data's longest under its template" in text
    out = plan_json(capsys, "model=tiny")
    start_up = build_plan(compose_train_config(["model=tiny"]), 1, prompt_tokens=82, device=device_type())
    assert out["total_bytes"] == start_up.total_bytes and out["shapes"]["prompt_tokens"] == 82


def test_vllm_s_headroom_shows_beside_a_total_equal_to_the_device(capsys):
    argv = ["model=tiny", "rollout=vllm", "--device", "cuda", "--device-memory", "8GiB", "--prompt-tokens", "40"]
    out = plan_json(capsys, *argv)
    assert out["total_bytes"] == 8 * 2**30  # gpu_memory_utilization null: vLLM takes what the others leave
    vllm = out["vllm"]
    assert vllm["kv_cache"] == vllm["bytes"] - vllm["weights"] and vllm["sequences"] > vllm["rows_at_once"] == 32
    main(argv)
    text = capsys.readouterr().out
    assert f"room for ~{vllm['sequences']:,} sequences of the longest prompt + max_new_tokens" in text
    assert "headroom: while generating, vLLM's" in text and "during the update it sleeps" in text
    set_share = plan_json(capsys, *argv, "rollout.vllm.gpu_memory_utilization=0.5")
    assert set_share["total_bytes"] < 8 * 2**30


def test_a_model_whose_tokenizer_is_not_here_is_planned_at_the_assumed_prompt_length(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    main(["model=qwen2_5_math_1_5b", "--device", "cuda", "--device-memory", "80GiB"])
    text = capsys.readouterr().out
    assert "longest prompt 512 tokens (assumed: the data's prompts cannot be counted here" in text


def test_tokenpo_plan_is_an_installed_command():
    import tomllib

    from support.env import REPO

    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["tokenpo-plan"] == "tokenpo.plan.cli:main"


@pytest.mark.e2e
def test_into_a_pipe_the_plan_prints_no_progress_bars(tmp_path):
    import subprocess
    import sys

    from support.cli import env_without_progress_settings
    from support.env import REPO

    proc = subprocess.run([sys.executable, "-m", "tokenpo.plan"], cwd=REPO, capture_output=True, text=True,
                          env=env_without_progress_settings(), timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("planned for: ") and "total 5.01 GiB" in proc.stdout
    assert "\r" not in proc.stdout + proc.stderr and "it/s" not in proc.stdout + proc.stderr, proc.stderr[-2000:]

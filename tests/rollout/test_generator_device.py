"""Every generate call draws from a seeded generator on the device its model samples on (tokenpo.rollout.engine.
seeded_generator): a CPU generator beside CUDA logits fails at the first sample. The generation-ahead worker's model
may live on a CUDA device of its own (rollout.async.generator_device); its device must reach the generator."""

from __future__ import annotations

import torch

from tokenpo.rollout import ahead
from tokenpo.rollout.ahead import WorkerSettings
from tokenpo.rollout.generator import GenerateRequest
from tokenpo.rollout.engine import Responses, SamplingParams, seeded_generator


def test_the_generator_is_seeded_on_the_device_it_is_asked_for():
    generator = seeded_generator(123, torch.device("cpu"))
    assert generator.device == torch.device("cpu")
    assert torch.rand(3, generator=generator).tolist() == torch.rand(3, generator=seeded_generator(123, "cpu")).tolist()


def test_the_ahead_worker_samples_with_a_generator_on_its_models_device(monkeypatch):
    made, sampled = [], []

    def fake_generator(seed, device):
        made.append((seed, device))
        return f"generator on {device}"

    def fake_generate(model, prompt_ids, params, pad_id, generator, check_every):
        sampled.append(generator)
        return Responses([[1]], [False])

    monkeypatch.setattr(ahead, "seeded_generator", fake_generator)
    monkeypatch.setattr("tokenpo.rollout.hf.generate_hf", fake_generate)
    settings = WorkerSettings(pad_id=0, threads=0, stop_check_every=None, device="cuda:1")
    request = GenerateRequest((3, 0), [[5, 6]], SamplingParams(1, 4), seed=77, version=2)
    ahead.generate_request(torch.nn.Linear(1, 1), request, settings)
    assert made == [(77, "cuda:1")]
    assert sampled == ["generator on cuda:1"]

"""Every generate call draws from a seeded generator on the device its model samples on (tokenpo.rollout.engine.
seeded_generator): a CPU generator beside CUDA logits fails at the first sample. The generation-ahead worker's model
may live on a CUDA device of its own (rollout.async.generator_device); its device must reach the generator."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from tokenpo.rollout import ahead
from tokenpo.rollout.ahead import WorkerSettings
from tokenpo.rollout.config import RolloutConfig
from tokenpo.rollout.generator import GenerateRequest
from tokenpo.rollout.engine import Responses, SamplingParams, seeded_generator


def test_the_generator_is_seeded_on_the_device_it_is_asked_for():
    generator = seeded_generator(123, torch.device("cpu"))
    assert generator.device == torch.device("cpu")
    assert torch.rand(3, generator=generator).tolist() == torch.rand(3, generator=seeded_generator(123, "cpu")).tolist()


def test_the_ahead_worker_samples_with_a_generator_on_its_models_device(monkeypatch):
    made, sampled, built = [], [], []

    def fake_generator(seed, device):
        made.append((seed, device))
        return f"generator on {device}"

    def fake_generate(model, prompt_ids, params, pad_id, generator, check_every):
        sampled.append(generator)
        return Responses([[1]], [False])

    def fake_model(spec, device):
        built.append(device)
        return torch.nn.Linear(1, 1)

    monkeypatch.setattr("tokenpo.rollout.engine.seeded_generator", fake_generator)
    monkeypatch.setattr("tokenpo.rollout.hf.generate_hf", fake_generate)
    monkeypatch.setattr(ahead, "worker_model", fake_model)
    settings = WorkerSettings(RolloutConfig(engine="hf"), SimpleNamespace(pad_token_id=0), threads=0, device="cuda:1")
    counter = SimpleNamespace(value=2)  # the trainer pushed version 2
    versions = ahead.SharedVersions({}, ahead.ModelSpec(None, torch.float32, "LlamaForCausalLM"), "cuda:1",
                                    SimpleNamespace(value=-1))
    worker = ahead.Worker(settings, versions, counter)
    request = GenerateRequest((3, 0), [[5, 6]], SamplingParams(1, 4), seed=77, version=2)
    assert worker.answer(request).responses.token_ids == [[1]]
    assert made == [(77, torch.device("cuda:1"))] and built == ["cuda:1"]
    assert sampled == ["generator on cuda:1"]
    assert versions.loaded.value == 2  # the model took version 2 from the shared copy

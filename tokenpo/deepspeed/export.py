"""The trained policy out of its DeepSpeed engine, as a plain Hugging Face model folder."""

from __future__ import annotations

from pathlib import Path

import torch

from tokenpo.deepspeed import dist
from tokenpo.models.lora import ADAPTER, is_lora, lora_scaling, merged_state_dict


def export_hf(policy, tokenizer, out: Path, stage: int) -> None:
    """The final policy in Hugging Face format (loadable with AutoModelForCausalLM.from_pretrained).

    A LoRA policy is written twice: merged into its base weights in `out` (a plain model, W + (alpha / r) B A computed
    into new tensors, the live weights untouched) and as the PEFT adapter in `out/adapter` (PeftModel.from_pretrained
    on the base model). Under ZeRO-3 every rank holds a shard: all ranks take part in consolidating the 16-bit weights,
    which rank 0 alone writes.
    """
    state = policy._zero3_consolidated_16bit_state_dict() if stage == 3 else None
    if dist.is_main():
        module = policy.module
        if is_lora(module):
            state = module.state_dict() if state is None else state
            module.save_pretrained(out / "adapter", state_dict=state)
            module.get_base_model().save_pretrained(out, state_dict=merged_state_dict(
                state, lora_scaling(module), module.peft_config[ADAPTER].fan_in_fan_out))
        else:
            module.save_pretrained(out, state_dict=state)
        tokenizer.save_pretrained(out)
    if dist.world_size() > 1:
        torch.distributed.barrier()

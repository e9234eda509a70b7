"""The trained policy out of its DeepSpeed engine, as a plain Hugging Face model folder."""

from __future__ import annotations

from pathlib import Path

import torch

from tokenpo.deepspeed import dist


def export_hf(policy, tokenizer, out: Path, stage: int) -> None:
    """The final policy in Hugging Face format (loadable with AutoModelForCausalLM.from_pretrained).

    Under ZeRO-3 every rank holds a shard: all ranks take part in consolidating the 16-bit weights, which rank 0
    alone writes.
    """
    state = policy._zero3_consolidated_16bit_state_dict() if stage == 3 else None
    if dist.is_main():
        policy.module.save_pretrained(out, state_dict=state)
        tokenizer.save_pretrained(out)
    if dist.world_size() > 1:
        torch.distributed.barrier()

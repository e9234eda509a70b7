"""The weights of a ZeRO-3 partitioned policy gathered for its export (tokenpo.trainer.core.policy.Policy.export)."""

from __future__ import annotations

from tokenpo.deepspeed import dist
from tokenpo.progress import progress


def zero3_16bit_state_dict(module) -> dict | None:
    """`module.state_dict()` of a ZeRO-3 partitioned model, on rank 0's CPU (None on the other ranks): every rank
    takes part (a collective). One module's parameters are gathered at a time, so no rank holds more than one layer
    in full (as in DeepSpeed's `_zero3_consolidated_16bit_state_dict`, which reports nothing for the minutes a
    32B model takes); rank 0's terminal shows a bar of the bytes gathered. A parameter under two names (an output
    layer tied to the embeddings) is one tensor under both keys, as in `state_dict()`."""
    import deepspeed

    main = dist.is_main()
    state = {} if main else None
    key_of = {}  # ds_id (the same for every name of a shared parameter) -> the key its tensor was stored under
    total = sum(p.ds_numel * p.element_size() for p in module.parameters())
    with progress(total=total, desc="gathering ZeRO-3 weights", unit="B", unit_scale=True, unit_divisor=1024,
                  enabled=main) as bar:
        for name, layer in module.named_modules(remove_duplicate=False):
            prefix = f"{name}." if name else ""
            own = dict(layer.named_parameters(recurse=False, remove_duplicate=False))
            new = [param for param in own.values() if param.ds_id not in key_of]
            # read-only (modifier_rank None): the shards are released again on exit, nothing is broadcast back
            with deepspeed.zero.GatheredParameters(new, modifier_rank=None):
                for key, param in own.items():
                    if param.ds_id not in key_of:
                        key_of[param.ds_id] = prefix + key
                        bar.update(param.ds_numel * param.element_size())
                        if main:
                            state[prefix + key] = param.detach().cpu()
                    elif main:
                        state[prefix + key] = state[key_of[param.ds_id]]
            if main:
                state.update((prefix + key, buffer.detach().cpu()) for key, buffer in layer.named_buffers(recurse=False)
                             if key not in layer._non_persistent_buffers_set)
    return state

"""Run by test_export.py: `python zero3_save.py <out_dir>` on one process. For the tiny model under ZeRO-3, with and
without LoRA adapters: the consolidated 16-bit state of tokenpo.deepspeed.export against DeepSpeed's own (same keys in
the same order, equal tensors, the tied output layer one tensor under both names), then Policy.export into
`<out_dir>/<name>`; for the full model two checkpoint saves into `<out_dir>/checkpoints` (the second one sized by the
first). Prints ZERO3 WORK DONE."""

from __future__ import annotations

import sys
from pathlib import Path

from tokenpo.progress import quiet_library_bars

quiet_library_bars()
import torch  # noqa: E402
from support.config import SMALL, compose_config  # noqa: E402

from tokenpo.deepspeed import dist  # noqa: E402
from tokenpo.deepspeed.engine import build_policy_engine  # noqa: E402
from tokenpo.deepspeed.export import zero3_16bit_state_dict  # noqa: E402
from tokenpo.models.loading import load_model  # noqa: E402
from tokenpo.trainer.core.optim import build_optimizer  # noqa: E402
from tokenpo.trainer.core.policy import Policy, PolicySettings  # noqa: E402
from tokenpo.trainer.harness.state import save_policy  # noqa: E402


def shared_keys(state: dict) -> list[list[str]]:
    """The keys of `state` grouped by the tensor object they hold."""
    by_id = {}
    for key, tensor in state.items():
        by_id.setdefault(id(tensor), []).append(key)
    return sorted(by_id.values())


def main(out: Path) -> None:
    dist.init_distributed("gloo")
    for name, extra in (("full", []), ("lora", ["model.lora.rank=2"])):
        cfg, _ = compose_config(SMALL + ["deepspeed=zero3", *extra])
        tokenizer, model = load_model(cfg.model, cfg.seed)
        optimizer = build_optimizer(model, cfg.trainer)
        engine = build_policy_engine(model, optimizer, cfg.deepspeed, micro_batch_size=cfg.trainer.micro_batch_size,
                                     max_grad_norm=cfg.trainer.max_grad_norm, world_size=1)
        policy = Policy(engine, optimizer, None, dist.device(), PolicySettings.from_config(cfg, dist.world_size()))
        ours = zero3_16bit_state_dict(policy.module)
        theirs = engine._zero3_consolidated_16bit_state_dict()
        assert list(ours) == list(theirs), (name, set(ours) ^ set(theirs))
        assert all(torch.equal(ours[k], theirs[k]) and ours[k].dtype == theirs[k].dtype for k in ours), name
        assert shared_keys(ours) == shared_keys(theirs), name
        assert any(len(keys) > 1 for keys in shared_keys(ours)), name  # the tied output layer
        print(f"{name}: {len(ours)} tensors equal DeepSpeed's", flush=True)
        policy.export(tokenizer, out / name)
        if name == "full":
            for step in (1, 2):
                save_policy(policy, out / "checkpoints", step, {"step": step}, keep_last=2, with_checksums=True)
    print("ZERO3 WORK DONE", flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]))

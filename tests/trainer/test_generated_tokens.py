"""The generated-token count behind tokenpo.compare's equal-compute axis: every dynamic-sampling round counts,
also the groups the filter dropped (scripted verdicts as in test_rollouts)."""

from __future__ import annotations


from support.rollouts import G, ScriptedContext
from tokenpo.rollout.engine import Responses
from tokenpo.trainer.rollouts import collect_rollouts


class LengthContext(ScriptedContext):
    """Prompt p<i> gets G responses of i + 1 tokens."""

    def generate(self, prompt_ids, params, generator):
        return Responses(token_ids=[[7] * (ids[0] + 1) for ids in prompt_ids for _ in range(G)],
                         truncated=[False] * (len(prompt_ids) * G))


def tokens_of(uids: list[str]) -> int:
    return G * sum(int(uid[1:]) + 1 for uid in uids)


def test_generated_tokens_count_every_round_and_dropped_group():
    # two rounds of 6 prompts; the batch keeps 4 mixed groups, the other 8 drawn were generated all the same
    ctx = LengthContext("MWMRIM" + "WMMWWW", prompts_per_step=4, oversample=1.5, max_gen_batches=5)
    batch = collect_rollouts(ctx, step=3)
    assert batch.generated_tokens == tokens_of(ctx.uids(list(range(12))))
    assert sum(map(len, batch.response_ids)) == tokens_of(ctx.uids([0, 2, 5, 7])) < batch.generated_tokens


def test_without_dynamic_sampling_generated_tokens_are_the_batch():
    ctx = LengthContext("RWMW" + "M" * 10, prompts_per_step=4)
    ctx.cfg.algorithm.dynamic_sampling.enabled = False
    batch = collect_rollouts(ctx, step=1)
    assert batch.generated_tokens == sum(map(len, batch.response_ids)) == tokens_of(ctx.uids([0, 1, 2, 3]))

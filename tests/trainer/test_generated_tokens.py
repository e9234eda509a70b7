"""The generated-token count behind tokenpo.compare's equal-compute axis: every dynamic-sampling round counts,
also the groups the filter dropped (scripted verdicts as in test_rollouts)."""

from __future__ import annotations

from dataclasses import replace


from support.rollouts import G, Scripted, ScriptedEngine
from tokenpo.rollout.engine import Responses


class LengthEngine(ScriptedEngine):
    """Prompt p<i> gets G responses of i + 1 tokens."""

    def sample(self, prompt_ids, params, rng):
        return Responses(token_ids=[[7] * (ids[0] + 1) for ids in prompt_ids for _ in range(G)],
                         truncated=[False] * (len(prompt_ids) * G))


class Lengths(Scripted):
    def make_engine(self) -> ScriptedEngine:
        return LengthEngine()


def tokens_of(uids: list[str]) -> int:
    return G * sum(int(uid[1:]) + 1 for uid in uids)


def test_generated_tokens_count_every_round_and_dropped_group():
    # two rounds of 6 prompts; the batch keeps 4 mixed groups, the other 8 drawn were generated all the same
    run = Lengths("MWMRIM" + "WMMWWW", prompts_per_step=4, oversample=1.5, max_gen_batches=5)
    batch = run.collect(step=3)
    assert batch.counts.generated_tokens == tokens_of(run.uids(list(range(12))))
    assert int(batch.lengths.sum()) == tokens_of(run.uids([0, 2, 5, 7])) < batch.counts.generated_tokens


def test_without_dynamic_sampling_generated_tokens_are_the_batch():
    run = Lengths("RWMW" + "M" * 10, prompts_per_step=4)
    run.sampling = replace(run.sampling, enabled=False)
    batch = run.collect(step=1)
    assert batch.counts.generated_tokens == int(batch.lengths.sum()) == tokens_of(run.uids([0, 1, 2, 3]))

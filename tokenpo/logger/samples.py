"""What the model writes, as table rows: sampled training rollouts every logger.samples_every steps, and each
evaluation's responses with their verdicts. RunLogger.log_samples sends them to W&B (a table per kind) and appends
them to `<run_dir>/samples.jsonl`, so offline and disabled runs keep them too.

Rows are bounded (logger.samples_rows per table) and spread over problems: the first response of every group or
problem comes before the second of any, so a table shows as many different problems as it has rows for.
"""

from __future__ import annotations

from typing import Iterable

from tokenpo.rewards.extract import extract_answer

ROLLOUT_COLUMNS = ("step", "prompt", "response", "reward", "verdict", "answer", "length", "truncated")
EVAL_COLUMNS = ("step", "benchmark", "prompt", "gold", "protocol", "response", "verdict", "answer")


def spread(rows_by_item: Iterable[list[dict]], limit: int) -> list[dict]:
    """At most `limit` rows, taking the i-th row of every item before the (i+1)-th of any."""
    items = [rows for rows in rows_by_item if rows]
    picked, depth = [], 0
    while len(picked) < limit and any(depth < len(rows) for rows in items):
        picked += [rows[depth] for rows in items if depth < len(rows)][: limit - len(picked)]
        depth += 1
    return picked


def rollout_rows(step: int, rollouts, rewards: list[float] | None, reward_cfg, limit: int) -> list[dict]:
    """Up to `limit` of the step's rollouts (a tokenpo.trainer.core.batch.RolloutBatch): the problem, the response, its
    reward (`rewards`, as the update saw it: shaped, format bonus included; None when the step made no update),
    verdict, extracted answer, length in tokens and whether it hit max_new_tokens."""
    g = rollouts.group_size
    rewards = rewards or [None] * len(rollouts.response_text)

    def row(i: int) -> dict:
        text = rollouts.response_text[i]
        answer = extract_answer(text, reward_cfg.answer_pattern, reward_cfg.fallback, reward_cfg.reasoning_tag)
        return {"step": step, "prompt": rollouts.examples[i // g].problem, "response": text, "reward": rewards[i],
                "verdict": rollouts.verdicts[i], "answer": answer, "length": int(rollouts.lengths[i]),
                "truncated": bool(rollouts.truncated[i])}

    return spread(([row(i) for i in range(k * g, (k + 1) * g)] for k in range(len(rollouts.examples))), limit)


def eval_rows(step: int, benchmark: str, records: list[dict], limit: int) -> list[dict]:
    """Up to `limit` of an evaluation's responses (tokenpo.evaluation.run records): greedy, then the samples."""

    def rows(record: dict) -> list[dict]:
        responses = [("greedy", record["greedy"])] if "greedy" in record else []
        responses += [("sample", sample) for sample in record.get("samples", [])]
        return [{"step": step, "benchmark": benchmark, "prompt": record["problem"], "gold": record["gold"],
                 "protocol": protocol, "response": r["response"], "verdict": r["verdict"], "answer": r["answer"]}
                for protocol, r in responses]

    return spread(map(rows, records), limit)

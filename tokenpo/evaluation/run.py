"""Evaluate a policy on a benchmark: greedy accuracy and/or n samples (mean@n, pass@k, maj@n).

Problems are split over ranks and the records gathered, so the same code serves training-time
evaluation on several processes and the stand-alone `python -m tokenpo.evaluate`.
"""

from __future__ import annotations

from typing import Callable

import torch

from tokenpo.data import Example
from tokenpo.deepspeed import dist
from tokenpo.evaluation.config import EvalConfig
from tokenpo.evaluation.metrics import summarize
from tokenpo.progress import progress
from tokenpo.rewards import CORRECT, count_verdicts, extract_answer
from tokenpo.rewards.numbers import parse_answer_number
from tokenpo.rollout.engine import Responses, SamplingParams

GenerateFn = Callable[[list[list[int]], SamplingParams, torch.Generator], Responses]


def vote_key(answer: str | None) -> str | None:
    """Answers that are the same number vote together (27, 27.0 and 27.00 are one answer)."""
    if answer is None:
        return None
    number = parse_answer_number(answer)
    return str(number) if number is not None else " ".join(answer.split())


def _score(scorer, texts: list[str], golds: list[str]) -> list[str]:
    return scorer.result(scorer.submit(texts, golds)) if texts else []


def evaluate(
    examples: list[Example],
    prompt_ids: Callable[[Example], list[int]],
    generate: GenerateFn,
    decode: Callable[[list[list[int]]], list[str]],
    scorer,
    cfg: EvalConfig,
    reward_pattern: tuple[str, str, str | None],
    *,
    max_new_tokens: int,
    stop_token_ids: tuple[int, ...],
    seed: int,
) -> tuple[dict[str, float], list[dict]]:
    """Returns (metrics, per-problem records on every rank). `reward_pattern` is (answer_pattern, fallback, reasoning_tag)."""
    rank, world = dist.rank(), dist.world_size()
    mine = examples[rank::world]
    generator = torch.Generator(device=dist.device()).manual_seed(seed * 1_000_003 + rank)
    records = [{"uid": ex.uid, "problem": ex.problem, "gold": ex.answer} for ex in mine]
    protocols = []
    if cfg.greedy:
        protocols.append(("greedy", SamplingParams(1, max_new_tokens, 0.0, 1.0, stop_token_ids)))
    if cfg.n:
        protocols.append(("samples", SamplingParams(cfg.n, max_new_tokens, cfg.temperature, cfg.top_p, stop_token_ids)))
    for kind, params in protocols:
        # rank 0's share on a terminal: responses done / total, rate, time left
        bar = progress(total=len(mine) * params.num_samples, desc=f"eval {cfg.name} ({kind})", unit="response",
                       enabled=rank == 0)
        per_call = max(1, cfg.batch_size // params.num_samples)
        # every rank makes as many generate calls as the rank with the most problems: under ZeRO-3 each call gathers
        # the weights from all ranks (a collective), so a rank with fewer (or no) problems joins the others' last
        # calls with its first problem (rank 0's if it has none), after its own work, and drops the output
        for lo in range(0, len(examples[0::world]), per_call):
            batch = mine[lo : lo + per_call]
            if not batch:
                generate([prompt_ids((mine or examples)[0])], params, generator)
                continue
            out = generate([prompt_ids(ex) for ex in batch], params, generator)
            texts = decode(out.token_ids)
            verdicts = _score(scorer, texts, [ex.answer for ex in batch for _ in range(params.num_samples)])
            for j, ex in enumerate(batch):
                rows = range(j * params.num_samples, (j + 1) * params.num_samples)
                record = records[lo + j]
                responses = [{"response": texts[r], "verdict": verdicts[r],
                              "answer": extract_answer(texts[r], *reward_pattern),
                              "asked_format": extract_answer(texts[r], reward_pattern[0], "none",
                                                             reward_pattern[2]) is not None}
                             for r in rows]
                if kind == "greedy":
                    record["greedy"] = responses[0]
                    record["greedy_correct"] = responses[0]["verdict"] == CORRECT
                else:
                    record["samples"] = responses
                    record["correct"] = [s["verdict"] == CORRECT for s in responses]
                    record["answers"] = [vote_key(s["answer"]) for s in responses]
            bar.update(len(texts))
        bar.close()
    gathered = [rec for part in dist.all_gather_objects(records) for rec in part]
    metrics = summarize(gathered, cfg.pass_k) if gathered else {}
    responses = [r["greedy"] for r in gathered if "greedy" in r]
    responses += [s for r in gathered for s in r.get("samples", ())]
    metrics.update({k.replace("reward/", ""): v for k, v in count_verdicts([s["verdict"] for s in responses]).items()})
    # the answer written in the asked-for form (e.g. \boxed{}), not found by a fallback
    metrics["asked_format_frac"] = sum(s["asked_format"] for s in responses) / max(1, len(responses))
    metrics["accuracy"] = metrics.get("greedy/accuracy", metrics.get(f"mean@{cfg.n}", 0.0))
    return metrics, gathered


def sample_lines(records: list[dict], count: int, width: int = 160) -> list[str]:
    """A few `question -> response -> verdict` lines, so a person sees what the model really writes."""
    lines = []
    for record in records[:count]:
        shown = record.get("greedy") or (record.get("samples") or [{}])[0]
        response = " ".join(str(shown.get("response", "")).split())[:width]
        lines.append(f"  Q: {record['problem']} | gold {record['gold']}\n    A: {response!r} -> {shown.get('verdict')}")
    return lines

"""Evaluate a policy on a benchmark: greedy accuracy and/or n samples (mean@n, pass@k, maj@n).

Problems are split over ranks and the records gathered, so the same code serves training-time
evaluation on several processes and the stand-alone `python -m tokenpo.evaluate`; `evaluate_benchmark` is the
one call both make.
"""

from __future__ import annotations

import contextlib
from dataclasses import asdict, dataclass
from typing import Callable, Protocol

import torch

from tokenpo.evaluation.judging import benchmark_reward
from tokenpo.data import Example
from tokenpo.data.prompts import capped_prompt_ids
from tokenpo.deepspeed import dist
from tokenpo.evaluation.benchmark import Benchmark, stop_token_ids
from tokenpo.evaluation.config import EvalConfig
from tokenpo.evaluation.metrics import summarize
from tokenpo.progress import progress
from tokenpo.rewards import CORRECT, AnswerSpec, RewardConfig, RewardScorer, Scorer, answer_spec, count_verdicts
from tokenpo.rewards.numbers import parse_answer_number
from tokenpo.rollout.config import RolloutConfig
from tokenpo.rollout.engine import Responses, SamplingParams, seeded_generator

GenerateFn = Callable[[list[list[int]], SamplingParams, torch.Generator], Responses]


class Sampler(Protocol):
    def sample(self, prompt_ids: list[list[int]], params: SamplingParams, generator: torch.Generator) -> list[str]:
        """The responses as text, params.num_samples per prompt, prompt by prompt."""


@dataclass(frozen=True)
class TextSampler:
    """A generator's sample call (Generator.sample), its token ids decoded as the scorer reads them (special tokens
    dropped)."""

    generate: GenerateFn
    tokenizer: object  # a Hugging Face tokenizer

    def sample(self, prompt_ids: list[list[int]], params: SamplingParams, generator: torch.Generator) -> list[str]:
        out = self.generate(prompt_ids, params, generator)
        return self.tokenizer.batch_decode(out.token_ids, skip_special_tokens=True)


@dataclass(frozen=True)
class EvalTask:
    """One benchmark ready to run: its protocols (`config`), its problems and their prompts, how answers are read,
    and the response limits."""

    config: EvalConfig
    examples: list[Example]
    prompt_ids: list[list[int]]  # examples[i]'s prompt under the benchmark's template and prompt cap
    answers: AnswerSpec
    max_new_tokens: int
    stop_token_ids: tuple[int, ...]

    def protocols(self) -> list[tuple[str, SamplingParams]]:
        """("greedy", one response at temperature 0) and/or ("samples", eval.n at eval.temperature and top_p)."""
        cfg, protocols = self.config, []
        if cfg.greedy:
            protocols.append(("greedy", SamplingParams(1, self.max_new_tokens, 0.0, 1.0, self.stop_token_ids)))
        if cfg.n:
            protocols.append(("samples", SamplingParams(cfg.n, self.max_new_tokens, cfg.temperature, cfg.top_p,
                                                        self.stop_token_ids)))
        return protocols


@dataclass(frozen=True)
class JudgedResponse:
    """One response with its verdict; eval JSON files hold it as a dict of these fields, in this order."""

    response: str
    verdict: str
    answer: str | None  # the final answer found (the fallback included)
    asked_format: bool  # the answer is in the asked-for form (e.g. \boxed{}), not found by a fallback


@dataclass
class ProblemRecord:
    """One problem's responses under each protocol run."""

    uid: str
    problem: str
    gold: str
    greedy: JudgedResponse | None = None
    samples: list[JudgedResponse] | None = None

    def responses(self) -> list[JudgedResponse]:
        return ([self.greedy] if self.greedy is not None else []) + (self.samples or [])

    def as_json(self) -> dict:
        """The record as eval JSON files, tokenpo.compare and the sample tables read it."""
        row = {"uid": self.uid, "problem": self.problem, "gold": self.gold}
        if self.greedy is not None:
            row["greedy"] = asdict(self.greedy)
            row["greedy_correct"] = self.greedy.verdict == CORRECT
        if self.samples is not None:
            row["samples"] = [asdict(s) for s in self.samples]
            row["correct"] = [s.verdict == CORRECT for s in self.samples]
            row["answers"] = [vote_key(s.answer) for s in self.samples]
        return row


@dataclass
class EvalResult:
    metrics: dict[str, float]
    records: list[dict]  # every rank's problems, as ProblemRecord.as_json writes them


def vote_key(answer: str | None) -> str | None:
    """Answers that are the same number vote together (27, 27.0 and 27.00 are one answer)."""
    if answer is None:
        return None
    number = parse_answer_number(answer)
    return str(number) if number is not None else " ".join(answer.split())


def judged(texts: list[str], verdicts: list[str], answers: AnswerSpec) -> list[JudgedResponse]:
    return [JudgedResponse(text, verdict, answers.answer(text), answers.in_asked_form(text))
            for text, verdict in zip(texts, verdicts)]


def evaluate(task: EvalTask, sampler: Sampler, scorer: Scorer, seed: int) -> EvalResult:
    """Metrics and per-problem records (every rank's) of `task`; sampled responses depend on `seed` and the rank."""
    rank, world = dist.rank(), dist.world_size()
    mine = list(range(rank, len(task.examples), world))
    generator = seeded_generator(seed * 1_000_003 + rank, dist.device())
    records = [ProblemRecord(task.examples[i].uid, task.examples[i].problem, task.examples[i].answer) for i in mine]
    for kind, params in task.protocols():
        # rank 0's share on a terminal: responses done / total, rate, time left
        bar = progress(total=len(mine) * params.num_samples, desc=f"eval {task.config.name} ({kind})",
                       unit="response", enabled=rank == 0)
        per_call = max(1, task.config.batch_size // params.num_samples)
        # every rank makes as many generate calls as the rank with the most problems: under ZeRO-3 each call gathers
        # the weights from all ranks (a collective), so a rank with fewer (or no) problems joins the others' last
        # calls with its first problem (rank 0's if it has none), after its own work, and drops the output
        for lo in range(0, len(task.examples[0::world]), per_call):
            batch = mine[lo : lo + per_call]
            if not batch:
                sampler.sample([task.prompt_ids[(mine or [0])[0]]], params, generator)
                continue
            texts = sampler.sample([task.prompt_ids[i] for i in batch], params, generator)
            golds = [task.examples[i].answer for i in batch for _ in range(params.num_samples)]
            responses = judged(texts, scorer.score(texts, golds), task.answers)
            for j, record in enumerate(records[lo : lo + per_call]):
                rows = responses[j * params.num_samples : (j + 1) * params.num_samples]
                if kind == "greedy":
                    record.greedy = rows[0]
                else:
                    record.samples = rows
            bar.update(len(texts))
        bar.close()
    gathered = [record for part in dist.all_gather_objects(records) for record in part]
    rows = [record.as_json() for record in gathered]
    return EvalResult(benchmark_metrics(gathered, rows, task.config), rows)


def benchmark_metrics(records: list[ProblemRecord], rows: list[dict], cfg: EvalConfig) -> dict[str, float]:
    """summarize's metrics, the verdict fractions over every response, asked_format_frac and the headline accuracy."""
    metrics = summarize(rows, cfg.pass_k) if rows else {}
    responses = [response for record in records for response in record.responses()]
    metrics.update({k.replace("reward/", ""): v for k, v in count_verdicts([s.verdict for s in responses]).items()})
    # the answer written in the asked-for form (e.g. \boxed{}), not found by a fallback
    metrics["asked_format_frac"] = sum(s.asked_format for s in responses) / max(1, len(responses))
    metrics["accuracy"] = metrics.get("greedy/accuracy", metrics.get(f"mean@{cfg.n}", 0.0))
    return metrics


def benchmark_task(benchmark: Benchmark, reward: RewardConfig, rollout: RolloutConfig, tokenizer) -> EvalTask:
    """The benchmark's prompts under its data config, answers read as `reward` (the benchmark's) says, responses
    capped at eval.max_new_tokens (else rollout.max_new_tokens) and stopped at EOS or rollout.eos_tokens."""
    cfg = benchmark.config
    return EvalTask(cfg, benchmark.examples,
                    [capped_prompt_ids(ex.problem, tokenizer, benchmark.data) for ex in benchmark.examples],
                    answer_spec(reward), cfg.max_new_tokens or rollout.max_new_tokens,
                    stop_token_ids(tokenizer, rollout.eos_tokens))


def evaluate_benchmark(benchmark: Benchmark, reward: RewardConfig, rollout: RolloutConfig, sampler: TextSampler,
                       seed: int, scorer: RewardScorer | None = None) -> EvalResult:
    """`benchmark` as training-time evaluation and `tokenpo.evaluate` both run it: judged as its own data config
    reads answers (tokenpo.evaluation.judging.benchmark_reward of the run's `reward` section), not as the training data's.

    `scorer` (e.g. the training one) is used when it judges alike; otherwise workers are started for this call.
    """
    judged_by = benchmark_reward(reward, benchmark.data)
    task = benchmark_task(benchmark, judged_by, rollout, sampler.tokenizer)
    running = scorer is not None and scorer.config == judged_by
    with contextlib.nullcontext(scorer) if running else RewardScorer(judged_by) as benchmark_scorer:
        return evaluate(task, sampler, benchmark_scorer, seed)


def sample_lines(records: list[dict], count: int, width: int = 160) -> list[str]:
    """A few `question -> response -> verdict` lines, so a person sees what the model really writes."""
    lines = []
    for record in records[:count]:
        shown = record.get("greedy") or (record.get("samples") or [{}])[0]
        response = " ".join(str(shown.get("response", "")).split())[:width]
        lines.append(f"  Q: {record['problem']} | gold {record['gold']}\n    A: {response!r} -> {shown.get('verdict')}")
    return lines

"""Pure evaluation metrics over per-problem sample correctness and extracted answers."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c correct: 1 - C(n-c, k) / C(n, k) (Chen et al. 2021, Codex, Eq. 1).

    Evaluated as 1 - prod_{i=n-c+1}^{n} (1 - k/i), which never forms the huge binomials.
    """
    if not 1 <= k <= n:
        raise ValueError(f"pass@k needs 1 <= k <= n, got k={k}, n={n}")
    if not 0 <= c <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n, got c={c}, n={n}")
    if n - c < k:
        return 1.0
    product = 1.0
    for i in range(n - c + 1, n + 1):
        product *= 1.0 - k / i
    return 1.0 - product


def mean_at_n(correct_matrix: Sequence[Sequence[bool]]) -> float:
    """Mean over problems of each problem's fraction of correct samples (avg@n)."""
    if not correct_matrix or any(len(row) == 0 for row in correct_matrix):
        raise ValueError("mean@n needs at least one problem and one sample per problem")
    return sum(sum(map(bool, row)) / len(row) for row in correct_matrix) / len(correct_matrix)


def majority_index(answers: Sequence[str | None]) -> int | None:
    """Index of the sample whose answer wins the vote; None when no sample has an answer.

    Votes count identical (already normalised) answer strings; unparsed samples (None) do not vote. Tie rule: among
    the answers with the most votes, the one seen first in sample order wins (deterministic, seed-free).
    """
    votes = Counter(answer for answer in answers if answer is not None)
    if not votes:
        return None
    top = max(votes.values())
    return next(i for i, answer in enumerate(answers) if answer is not None and votes[answer] == top)


def maj_at_n(answers_per_problem: Sequence[Sequence[str | None]],
             correct_per_problem: Sequence[Sequence[bool]]) -> float:
    """Majority-vote accuracy: a problem counts as solved when its winning answer (see majority_index) is correct.

    correct_per_problem[p][i] is the correctness of answers_per_problem[p][i]; a problem with no parsed answer
    scores 0.
    """
    if len(answers_per_problem) != len(correct_per_problem) or not answers_per_problem:
        raise ValueError("maj@n needs one answer list and one correctness list per problem (at least one problem)")
    solved = 0
    for answers, correct in zip(answers_per_problem, correct_per_problem):
        if len(answers) != len(correct):
            raise ValueError(f"maj@n: {len(answers)} answers but {len(correct)} correctness values for a problem")
        winner = majority_index(answers)
        solved += winner is not None and bool(correct[winner])
    return solved / len(answers_per_problem)


def summarize(records: Sequence[Mapping], ks: Sequence[int]) -> dict[str, float]:
    """Benchmark metrics from per-problem records.

    Each record holds `correct` (list[bool], one per sampled response), `answers` (list[str | None], the extracted
    normalised answers, same length) and optionally `greedy_correct` (bool). Every problem must have the same number
    n of samples. Returns `greedy/accuracy` (when every record has greedy_correct), `mean@n`, `pass@k` for each
    k <= n (larger k are skipped), `maj@n`, and `num_problems`.
    """
    if not records:
        raise ValueError("summarize needs at least one problem record")
    metrics: dict[str, float] = {"num_problems": len(records)}
    greedy = [record.get("greedy_correct") for record in records]
    if all(value is not None for value in greedy):
        metrics["greedy/accuracy"] = sum(map(bool, greedy)) / len(greedy)
    sample_counts = {len(record.get("correct", ())) for record in records}
    if len(sample_counts) != 1:
        raise ValueError(f"every problem must have the same number of samples, got {sorted(sample_counts)}")
    n = sample_counts.pop()
    if n == 0:
        return metrics
    correct = [record["correct"] for record in records]
    metrics[f"mean@{n}"] = mean_at_n(correct)
    for k in sorted(set(ks)):
        if k <= n:
            metrics[f"pass@{k}"] = sum(pass_at_k(n, sum(map(bool, row)), k) for row in correct) / len(correct)
    metrics[f"maj@{n}"] = maj_at_n([record["answers"] for record in records], correct)
    return metrics


def metric_names(cfg) -> list[str]:
    """The keys `tokenpo.evaluation.run.evaluate` returns for a benchmark config (an EvalConfig): `summarize`'s, the
    verdict fractions, asked_format_frac and accuracy. Sweeps check trainer.objective against them up front."""
    from tokenpo.rewards.verdicts import count_verdicts

    names = ["num_problems", "asked_format_frac", "accuracy"]
    names += [key.replace("reward/", "") for key in count_verdicts([])]
    if cfg.greedy:
        names.append("greedy/accuracy")
    if cfg.n:
        names += [f"mean@{cfg.n}", f"maj@{cfg.n}"] + [f"pass@{k}" for k in sorted(set(cfg.pass_k)) if k <= cfg.n]
    return names

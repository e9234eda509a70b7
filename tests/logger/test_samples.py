"""Issue 23 item 1: tables of what the model writes, in W&B (read back from an offline run's .wandb file) and in
<run_dir>/samples.jsonl; bounded, spread over problems, off with logger.samples_every=0."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import wandb
from wandb.proto import wandb_internal_pb2

from support.env import REPO, cli_env
from tokenpo.errors import ConfigError
from tokenpo.logger.config import LoggerConfig
from tokenpo.logger.run_logger import RunLogger
from tokenpo.trainer.harness.identity import RunIdentity
from tokenpo.logger.samples import EVAL_COLUMNS, ROLLOUT_COLUMNS, eval_rows, spread
from tokenpo.logger.wandb_files import records


def wandb_tables(run_dir: Path) -> dict[tuple[int, str], dict]:
    """{(step, key): {"columns", "data"}} of every table an offline run logged, read from its .wandb file and the
    table files it points to."""
    (path,) = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    fields: dict[tuple[int, str], dict] = {}
    for raw in records(path):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(raw)
        if record.WhichOneof("record_type") != "history":
            continue
        for item in record.history.item:  # a table is stored as one item per field, keyed [table key, field]
            if len(item.nested_key) == 2:
                key = (record.history.step.num, item.nested_key[0])
                fields.setdefault(key, {})[item.nested_key[1]] = json.loads(item.value_json)
    tables = {key: json.loads((path.parent / "files" / value["path"]).read_text())
              for key, value in fields.items() if value.get("_type") == "table-file"}
    return tables


def samples_file(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]


def test_spread_takes_one_row_of_every_item_before_a_second_of_any():
    items = [["a1", "a2", "a3"], [], ["b1"], ["c1", "c2"]]
    assert spread(items, 5) == ["a1", "b1", "c1", "a2", "c2"]
    assert spread(items, 2) == ["a1", "b1"]
    assert spread(items, 100) == ["a1", "b1", "c1", "a2", "c2", "a3"]


def test_eval_rows_hold_greedy_then_samples_with_verdicts():
    records = [{"problem": f"p{i}", "gold": str(i), "greedy": {"response": f"g{i}", "verdict": "wrong", "answer": "7"},
                "samples": [{"response": f"s{i}{j}", "verdict": "correct", "answer": str(i)} for j in range(2)]}
               for i in range(3)]
    rows = eval_rows(5, "math500", records, 4)
    assert [(r["prompt"], r["protocol"], r["response"], r["verdict"]) for r in rows] == [
        ("p0", "greedy", "g0", "wrong"), ("p1", "greedy", "g1", "wrong"), ("p2", "greedy", "g2", "wrong"),
        ("p0", "sample", "s00", "correct")]
    assert all(tuple(r) == EVAL_COLUMNS and r["step"] == 5 and r["benchmark"] == "math500" for r in rows)


def test_logged_tables_are_in_wandb_and_samples_jsonl(tmp_path):
    logger = RunLogger(LoggerConfig(mode="offline"), RunIdentity(tmp_path, "r", "g", {}), enabled=True)
    rows = [{"step": 3, "prompt": "1+1?", "response": r"\boxed{2}", "reward": 1.0, "verdict": "correct",
             "answer": "2", "length": 9, "truncated": False},
            {"step": 3, "prompt": "1+2?", "response": "no idea", "reward": 0.0, "verdict": "no_answer",
             "answer": None, "length": 3, "truncated": True}]
    logger.log_samples(3, "rollouts", rows)
    logger.log(3, {"reward/mean": 0.5})
    logger.finish()
    wandb.teardown()
    table = wandb_tables(tmp_path)[3, "samples/rollouts"]
    assert table["columns"] == list(ROLLOUT_COLUMNS)
    assert table["data"] == [[row[c] for c in ROLLOUT_COLUMNS] for row in rows]
    assert samples_file(tmp_path) == [{"table": "rollouts", **row} for row in rows]


def test_samples_every_zero_logs_no_table(tmp_path):
    logger = RunLogger(LoggerConfig(mode="disabled", samples_every=0), RunIdentity(tmp_path, "r", "g", {}),
                       enabled=True)
    logger.log_samples(1, "rollouts", [{"step": 1, "response": "x"}])
    assert not (tmp_path / "samples.jsonl").exists()


@pytest.mark.parametrize("key, value", [("samples_every", -1), ("samples_rows", 0), ("samples_every", 1.5)])
def test_bad_samples_keys_name_the_key(key, value):
    with pytest.raises(ConfigError, match=rf"^logger\.{key} must be an integer"):
        LoggerConfig(**{key: value}).validate()


@pytest.mark.e2e
def test_a_training_run_logs_rollouts_and_eval_samples_to_wandb_and_the_run_dir(tmp_path):
    run_dir = tmp_path / "run"
    env = cli_env(WANDB_SILENT="true")
    proc = subprocess.run([sys.executable, "-m", "tokenpo.train", "model=tiny", "logger.mode=offline",
                           "rollout.max_new_tokens=8", "data.prompts_per_step=4", "eval.max_problems=4",
                           "reward.num_workers=1", "reward.fn=trainer_rewards:even_length", "trainer.max_steps=2",
                           "logger.samples_every=1", "logger.samples_rows=5", f"hydra.run.dir={run_dir}"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    tables = wandb_tables(run_dir)
    # eval before training (step 0) and after the last step; rollouts at every step (samples_every=1)
    assert sorted(tables) == [(0, "samples/eval/arith"), (1, "samples/rollouts"), (2, "samples/eval/arith"),
                              (2, "samples/rollouts")]
    rollouts = tables[1, "samples/rollouts"]
    assert rollouts["columns"] == list(ROLLOUT_COLUMNS) and len(rollouts["data"]) == 5
    rows = [dict(zip(ROLLOUT_COLUMNS, values)) for values in rollouts["data"]]
    # 4 prompts x 4 responses: the first response of each of the 4 prompts, then a second one of the first
    assert len({row["prompt"] for row in rows}) == 4 and rows[4]["prompt"] == rows[0]["prompt"]
    for row in rows:
        # trainer_rewards:even_length pays even-length responses; GRPO's reward is 1 / 0
        assert row["verdict"] == ("correct" if len(row["response"]) % 2 == 0 else "wrong")
        assert row["reward"] == (1.0 if row["verdict"] == "correct" else 0.0)
        assert row["step"] == 1 and 1 <= row["length"] <= 8 and row["truncated"] == (row["length"] == 8)
    evals = tables[2, "samples/eval/arith"]
    assert evals["columns"] == list(EVAL_COLUMNS) and len(evals["data"]) == 4  # 4 problems, greedy only
    written = samples_file(run_dir)
    assert [row for row in written if row["table"] == "rollouts" and row["step"] == 1] == [
        {"table": "rollouts", **row} for row in rows]
    assert {(row["step"], row["table"]) for row in written} == {(0, "eval/arith"), (1, "rollouts"), (2, "eval/arith"),
                                                                 (2, "rollouts")}

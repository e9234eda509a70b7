"""RunState: what a checkpoint carries besides the model, in the client-state keys checkpoints have on disk."""

from __future__ import annotations

from tokenpo.trainer.harness.state import RunState


def test_the_client_state_keeps_the_on_disk_keys_and_reads_back():
    state = RunState(step=7, sampler={"epoch": 1, "position": 12, "seed": 0, "num_examples": 40}, wandb_id="abc",
                     generated_tokens=1234, elapsed_s=56.5, eval_before=0.25, eval_after=0.5)
    client = state.to_client_state()
    assert client == {"step": 7, "sampler": {"epoch": 1, "position": 12, "seed": 0, "num_examples": 40},
                      "wandb_id": "abc", "history": {"generated_tokens": 1234, "elapsed_s": 56.5,
                                                     "eval_before": 0.25, "eval_after": 0.5}}
    assert RunState.from_client_state(client) == state


def test_a_run_without_evaluations_saves_no_accuracy_and_a_sparse_history_reads_as_a_fresh_one():
    client = RunState(step=2, sampler={}, generated_tokens=10, elapsed_s=1.0).to_client_state()
    assert client["history"] == {"generated_tokens": 10, "elapsed_s": 1.0}
    resumed = RunState.from_client_state({"step": 3, "sampler": {}, "history": {}})
    assert (resumed.generated_tokens, resumed.elapsed_s, resumed.eval_before, resumed.wandb_id) == (0, 0.0, None, None)

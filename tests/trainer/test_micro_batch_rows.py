"""A micro-batch below a group (trainer.micro_batch_size < rollout.group_size) splits the group's rows over several
forward/backward passes (tokenpo.trainer.core.batch.group_micro_batches) and leaves the update unchanged: group
statistics and loss normalisers come from the whole batch before the micro-batch loop."""

from __future__ import annotations

import copy

import pytest
import torch

from support.config import ALGORITHM_NAMES, SMALL, compose_config
from support.runs import fixed_rollouts, skewed_rollouts
from tokenpo.models.loading import load_model
from tokenpo.models.logprobs import with_response_pass
from tokenpo.plan.memory import with_values
from tokenpo.rewards import CORRECT, WRONG
from tokenpo.trainer.core import worst_case
from tokenpo.trainer.core.batch import MicroBatch, group_micro_batches
from tokenpo.trainer.core.rollouts import rollout_batch
from tokenpo.trainer.core.policy import Policy, PolicySettings
from tokenpo.trainer.core.step import StepSettings, update_policy
from tokenpo.trainer.core.timings import Timings

ALGORITHMS = ALGORITHM_NAMES  # every conf/algorithm/*.yaml
GROUPS, GROUP_SIZE, MAX_NEW = 4, 4, 8
# every group mixed, so every row has a non-zero advantage
VERDICTS = [[CORRECT, WRONG, WRONG, CORRECT], [WRONG, CORRECT, WRONG, WRONG], [CORRECT, CORRECT, WRONG, CORRECT],
            [WRONG, WRONG, CORRECT, WRONG]]
LR = 0.05  # SGD on the recorded gradient: the second mini-batch is off-policy, so ratios and clipping act
# fp32 sums in another order: the gradients agree to float rounding
ATOL, RTOL = 1e-6, 1e-5


@pytest.fixture(autouse=True)
def one_thread():
    """One intra-op thread, as SMALL's trainer.threads=1 gives train(): on these tiny tensors more threads only
    contend (10x slower on 2 busy cores)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


class RecordingEngine:
    """Stands in for the DeepSpeed engine: backward adds gradients up, step records them and takes an SGD step."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.module = with_response_pass(module)  # as Policy.build gives it the trainer's passes
        self.gradients: list[dict[str, torch.Tensor]] = []

    def __call__(self, *args, **kwargs):  # as DeepSpeed's engine calls its module (the update's pass)
        return self.module(*args, **kwargs)

    def backward(self, loss: torch.Tensor, scale_wrt_gas: bool) -> None:
        loss.backward()

    def step(self) -> None:
        params = dict(self.module.named_parameters())
        self.gradients.append({name: p.grad.clone() for name, p in params.items() if p.grad is not None})
        with torch.no_grad():
            for p in params.values():
                if p.grad is not None:
                    p -= LR * p.grad
                    p.grad = None

    def get_global_grad_norm(self) -> None:
        return None

    def get_lr(self) -> list[float]:
        return [LR]


def recorded_rows(monkeypatch) -> tuple[list[int], list[int]]:
    """(rows of each pass with grad, rows of each pass without), recorded from the Policy's forward passes."""
    with_grad, without = [], []
    logprobs, reference_logprobs = Policy.logprobs, Policy.reference_logprobs

    def spy(policy, tokens, *, grad, **kwargs):
        (with_grad if grad else without).append(tokens.response_ids.shape[0])
        return logprobs(policy, tokens, grad=grad, **kwargs)

    def reference_spy(policy, tokens):
        without.append(tokens.response_ids.shape[0])
        return reference_logprobs(policy, tokens)

    monkeypatch.setattr(Policy, "logprobs", spy)
    monkeypatch.setattr(Policy, "reference_logprobs", reference_spy)
    return with_grad, without


def recording_policy(cfg, engine: RecordingEngine, reference) -> Policy:
    """The Policy over the recording engine (no optimizer: the engine's step takes the SGD step)."""
    return Policy(engine, None, with_response_pass(reference), torch.device("cpu"), PolicySettings.from_config(cfg))


def algorithm_setup(algorithm: str, overrides: list[str] = ()):
    """(config, tokenizer, initial policy, reference) of a step of `algorithm` (with `overrides`), composed once for
    its updates."""
    cfg, _ = compose_config(SMALL + [*overrides, f"algorithm={algorithm}", f"data.prompts_per_step={GROUPS}",
                                     f"rollout.group_size={GROUP_SIZE}", f"rollout.max_new_tokens={MAX_NEW}",
                                     "trainer.mini_batches=2",
                                     # token selections (Clip-Cov, KL-Cov, 80/20) step-wide, the split-exact mode (a
                                     # no-op for the other algorithms); the reference per-micro-batch mode depends on
                                     # the split by design (tests/algorithms/test_selection.py)
                                     "algorithm.loss.selection_scope=step"])
    tokenizer, model = load_model(cfg.model, cfg.seed)
    reference = copy.deepcopy(model).requires_grad_(False)
    return cfg, tokenizer, model, reference


def one_update(monkeypatch, setup, micro_batch_size: int, rollouts=None, **trainer):
    """(recorded gradients of the step's two updates, rows of each pass with grad, rows of each pass without, the
    step's metrics); `trainer`: other trainer keys (micro_batch_tokens, pack_sequences, ...)."""
    cfg, tokenizer, model, reference = setup
    cfg = with_values(cfg, trainer__micro_batch_size=micro_batch_size,
                      **{f"trainer__{key}": value for key, value in trainer.items()})
    engine = RecordingEngine(copy.deepcopy(model))
    with_grad, without = recorded_rows(monkeypatch)
    run = StepSettings.from_config(cfg, tokenizer.pad_token_id)
    batch = rollout_batch(rollouts or fixed_rollouts(len(tokenizer), VERDICTS, MAX_NEW, 4321), run.reward)
    update = update_policy(run, recording_policy(cfg, engine, reference), batch, Timings())
    return engine.gradients, with_grad, without, update.metrics


def assert_same_gradients(gradients, whole, label: str, atol: float = ATOL, rtol: float = RTOL) -> None:
    assert len(gradients) == len(whole) == 2
    for got, want in zip(gradients, whole):
        assert got.keys() == want.keys()
        assert any(float(g.abs().max()) > 1e-3 for g in want.values())  # the update moves the weights
        for name in want:
            torch.testing.assert_close(got[name], want[name], atol=atol, rtol=rtol, msg=f"{label}: {name}")


def test_rows_of_a_group_split_into_slices_the_last_one_shorter():
    longest = [5, 2, 9]
    assert group_micro_batches([0, 1, 2], longest, 3, 4) == [
        MicroBatch([1], [4, 5, 6]), MicroBatch([1], [7]), MicroBatch([0], [0, 1, 2]), MicroBatch([0], [3]),
        MicroBatch([2], [8, 9, 10]), MicroBatch([2], [11])]
    assert group_micro_batches([0, 1, 2], longest, 8, 4) == [MicroBatch([1, 0], [4, 5, 6, 7, 0, 1, 2, 3]),
                                                             MicroBatch([2], [8, 9, 10, 11])]


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_micro_batches_below_a_group_give_the_whole_group_update(monkeypatch, algorithm):
    setup = algorithm_setup(algorithm)
    whole, whole_rows, _, _ = one_update(monkeypatch, setup, GROUP_SIZE)
    assert whole_rows == [GROUP_SIZE] * GROUPS  # 2 mini-batches of 2 groups, one group per pass
    for micro_batch_size, rows in ((1, [1] * GROUP_SIZE), (3, [3, 1])):
        gradients, with_grad, without, _ = one_update(monkeypatch, setup, micro_batch_size)
        assert with_grad == rows * GROUPS
        # the old-policy / reference passes (when the algorithm runs them) use the same slices
        assert without == rows * GROUPS * (len(without) // (len(rows) * GROUPS)), without
        assert_same_gradients(gradients, whole, algorithm)


SKEWED_MAX_NEW = 32  # one response in four at 32 tokens, the others 1-3: the longest >= 10x the median
# fp32 sums over other row sets and (packed) attention in another order: measured up to ~2e-6 on gradients of ~1e-1
PACKED_ATOL = 1e-5
# (trainer keys, the update passes per mini-batch expected): token budgets that split the groups' rows over passes
TOKEN_SPLITS = [
    (dict(micro_batch_tokens=48), None),  # about one long row (prompt 3-7 + 32) with a few short ones per pass
    (dict(micro_batch_tokens=48, pack_sequences=True), None),
    (dict(micro_batch_tokens=400), 1),  # every row of a mini-batch in one pass
    (dict(pack_sequences=True), 2),  # by sequence count (one group per pass), packed
]


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_token_budgets_and_packing_give_the_whole_group_update_on_skewed_lengths(monkeypatch, algorithm):
    setup = algorithm_setup(algorithm)
    tokenizer = setup[1]
    rollouts = skewed_rollouts(len(tokenizer), VERDICTS, SKEWED_MAX_NEW, 99)
    lengths = sorted(len(r) for r in rollouts.response_ids)
    assert lengths[-1] >= 10 * lengths[len(lengths) // 2]
    whole, _, _, _ = one_update(monkeypatch, setup, GROUP_SIZE, rollouts)
    for trainer, passes in TOKEN_SPLITS:
        gradients, with_grad, _, metrics = one_update(monkeypatch, setup, GROUP_SIZE, rollouts, **trainer)
        budget = trainer.get("micro_batch_tokens")
        if passes is not None:
            assert metrics["batch/micro_batches"] == passes * 2, trainer
        if budget == 48:  # rows of one group in different passes
            assert metrics["batch/micro_batches"] > 4 and any(rows % GROUP_SIZE for rows in with_grad), with_grad
        if trainer.get("pack_sequences"):
            assert metrics["batch/padding_frac"] == 0.0
        else:
            assert metrics["batch/padding_frac"] > 0.0
        assert_same_gradients(gradients, whole, f"{algorithm} {trainer}", atol=PACKED_ATOL)


@pytest.mark.parametrize("variant", [
    "algorithm.aggregation=token-mean", "algorithm.aggregation=seq-mean-token-sum",
    "algorithm.aggregation=seq-mean-token-sum-norm", "algorithm.loss.entropy_coef=0.01",
    "algorithm.loss.tis_cap=2.0 rollout=vllm", "trainer.recompute_head=true", "model.gradient_checkpointing=true",
    "model.lora.rank=4"])
def test_token_budgets_and_packing_are_exact_with_every_aggregation_and_option(monkeypatch, variant):
    setup = algorithm_setup("grpo", variant.split())  # the config only: no engine is built
    rollouts = skewed_rollouts(len(setup[1]), VERDICTS, SKEWED_MAX_NEW, 7)
    whole, _, _, _ = one_update(monkeypatch, setup, GROUP_SIZE, rollouts)
    for trainer in (dict(micro_batch_tokens=48), dict(micro_batch_tokens=48, pack_sequences=True)):
        gradients, _, _, _ = one_update(monkeypatch, setup, GROUP_SIZE, rollouts, **trainer)
        assert_same_gradients(gradients, whole, f"{variant} {trainer}", atol=PACKED_ATOL)


def test_the_worst_case_pass_trains_the_largest_slice_of_a_group(monkeypatch):
    """Before step 1 (tokenpo.trainer.core.worst_case): the no-grad passes in the run's slices, the pass with grad on the
    largest one (3 of a group's 4 rows), not the whole group."""
    cfg, tokenizer, model, reference = algorithm_setup("gtpo")
    cfg = with_values(cfg, trainer__micro_batch_size=3)
    policy = recording_policy(cfg, RecordingEngine(model), reference)
    with_grad, without = recorded_rows(monkeypatch)
    prompt_ids = fixed_rollouts(len(tokenizer), VERDICTS, MAX_NEW, 4321).prompt_ids
    shapes = worst_case.run_worst_case(cfg, StepSettings.from_config(cfg, tokenizer.pad_token_id), policy, prompt_ids)
    assert (shapes.micro_rows, shapes.micro_groups) == (3, 1)
    assert with_grad == [3] and without == [3, 1]  # one prompt's 4 rows: old log-probs and entropy in 3 + 1


@pytest.mark.parametrize("pack", [False, True])
def test_the_worst_case_pass_trains_the_largest_token_budget_micro_batch(monkeypatch, pack):
    """With trainer.micro_batch_tokens the largest pass is as many rows of the longest prompt + max_new_tokens as the
    budget holds (3 here), packed or not."""
    cfg, tokenizer, model, reference = algorithm_setup("grpo")
    prompt_ids = fixed_rollouts(len(tokenizer), VERDICTS, MAX_NEW, 4321).prompt_ids
    longest = max(map(len, prompt_ids)) + MAX_NEW
    cfg = with_values(cfg, trainer__micro_batch_tokens=3 * longest + 1, trainer__pack_sequences=pack)
    policy = recording_policy(cfg, RecordingEngine(model), reference)
    with_grad, without = recorded_rows(monkeypatch)
    shapes = worst_case.run_worst_case(cfg, StepSettings.from_config(cfg, tokenizer.pad_token_id), policy, prompt_ids)
    assert (shapes.micro_rows, shapes.micro_groups) == (3, 1)
    assert with_grad == [3]
    assert without == [3, 1, 3, 1]  # grpo at 2 mini-batches: the old-policy and the reference passes, 4 rows each

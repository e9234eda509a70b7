"""PromptSampler: full batches, each example once per epoch, reshuffled per epoch, exact resume."""

import pytest

from tokenpo.data import Example, PromptSampler
from tokenpo.errors import ConfigError

EXAMPLES = [Example(uid=str(i), problem=f"What is {i} + 1?", answer=str(i + 1)) for i in range(10)]


def _uids(batches):
    return [[e.uid for e in batch] for batch in batches]


def test_batches_cover_each_epoch_once_and_wrap_into_the_next():
    sampler = PromptSampler(EXAMPLES, batch_size=4, seed=3)
    batches = _uids(sampler.next_batch() for _ in range(5))  # 20 draws = exactly two epochs of 10
    assert all(len(batch) == 4 for batch in batches)
    flat = [uid for batch in batches for uid in batch]
    first_epoch, second_epoch = flat[:10], flat[10:]
    assert sorted(first_epoch) == sorted(second_epoch) == sorted(e.uid for e in EXAMPLES)
    assert first_epoch != second_epoch  # reshuffled
    assert first_epoch != [e.uid for e in EXAMPLES]
    assert sampler.state_dict() == {"epoch": 2, "position": 0, "seed": 3, "num_examples": 10}


def test_order_depends_only_on_seed():
    def first_batches(seed):
        sampler = PromptSampler(EXAMPLES, batch_size=3, seed=seed)
        return _uids(next(sampler) for _ in range(4))

    assert first_batches(7) == first_batches(7)
    assert first_batches(7) != first_batches(8)


def test_state_round_trip_resumes_at_the_same_position():
    original = PromptSampler(EXAMPLES, batch_size=4, seed=11)
    for _ in range(3):  # mid second epoch: position 2
        original.next_batch()
    state = original.state_dict()
    assert state == {"epoch": 1, "position": 2, "seed": 11, "num_examples": 10}
    resumed = PromptSampler(EXAMPLES, batch_size=4, seed=0)
    resumed.load_state_dict(dict(state))
    assert _uids(resumed.next_batch() for _ in range(6)) == _uids(original.next_batch() for _ in range(6))


def test_resume_with_other_data_or_bad_state_is_rejected():
    sampler = PromptSampler(EXAMPLES, batch_size=2, seed=0)
    with pytest.raises(ConfigError, match=r"saved for 12 training examples, the data now has 10"):
        sampler.load_state_dict({"epoch": 0, "position": 0, "seed": 0, "num_examples": 12})
    with pytest.raises(ConfigError, match=r"prompt sampler state lacks position"):
        sampler.load_state_dict({"epoch": 0, "seed": 0, "num_examples": 10})


def test_batch_larger_than_data_or_empty_data_is_a_config_error():
    with pytest.raises(ConfigError, match=r"data.prompts_per_step \(11\) exceeds the 10 training examples"):
        PromptSampler(EXAMPLES, batch_size=11, seed=0)
    with pytest.raises(ConfigError, match=r"training split is empty"):
        PromptSampler([], batch_size=1, seed=0)

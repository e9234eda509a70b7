"""Arithmetic curriculum: problem spaces, exact answers (re-derived independently), disjoint seeded splits."""

import re

import pytest

from tokenpo.data.arith import LEVELS, ArithConfig, arith_splits, level_space, split_counts
from tokenpo.errors import ConfigError


def _echo_proof(a: int, b: int, answer: int) -> bool:
    return answer not in (a, b)


def test_level_space_sizes():
    # level 1: sums and differences a>=b of one-digit numbers; level 2 the same over 10..99; level 3: a in 1..9
    # times b in 1..99 plus the reversed order for two-digit b -- each without the problems whose answer is one
    # of their operands (0 + 5, 7 - 0, 4 - 2, 1 x 8), counted here by brute force
    def add_sub(low, high):
        r = range(low, high + 1)
        return (sum(_echo_proof(a, b, a + b) for a in r for b in r)
                + sum(_echo_proof(a, b, a - b) for a in r for b in r if a >= b))

    mult = sum(_echo_proof(a, b, a * b) for a in range(1, 10) for b in range(1, 100))
    mult += sum(_echo_proof(a, b, a * b) for a in range(1, 10) for b in range(10, 100))
    assert [len(level_space(level)) for level in (1, 2, 3)] == [add_sub(0, 9), add_sub(10, 99), mult]
    assert len(level_space(1)) == 122


@pytest.mark.parametrize("level", [1, 2, 3, 4])
def test_no_answer_stands_in_its_question(level):
    # echoing the question must never end in the right number
    for text, answer in level_space(level):
        assert str(answer) not in re.findall(r"\d+", text)


def test_level_space_texts_are_unique():
    for level in LEVELS:
        texts = [text for text, _ in level_space(level)]
        assert len(set(texts)) == len(texts)


@pytest.mark.parametrize("level", [1, 2, 3])
def test_expression_answers_are_exact_and_non_negative(level):
    for text, answer in level_space(level):
        a, op, b = re.fullmatch(r"What is (\d+) ([+×-]) (\d+)\?", text).groups()
        assert answer == {"+": int(a) + int(b), "-": int(a) - int(b), "×": int(a) * int(b)}[op] >= 0


def test_word_problem_answers_follow_the_story():
    # independent reading: the first number is the start, each later verb adds or removes its number
    signs = {"buys": 1, "gets": 1, "gives away": -1, "gives": -1, "loses": -1}
    verb = re.compile(r"(buys|gets|gives away|gives|loses) (\d+)")
    for text, answer in level_space(4):
        total = int(re.search(r"has (\d+)", text).group(1))
        steps = verb.findall(text)
        assert len(steps) == 2, text
        for word, number in steps:
            total += signs[word] * int(number)
            assert total >= 0, text
        assert answer == total, text


def test_example_problem_text_is_short_and_answers_are_integer_strings():
    train, held_out = arith_splits(ArithConfig(levels=[1, 2, 3, 4], weights=[1, 1, 1, 1], train_size=40, eval_size=8))
    for example in train + held_out:
        assert re.fullmatch(r"\d+", example.answer)
        assert len(example.problem) < 120
        assert example.uid.startswith(f"arith/L{example.meta['level']}/")


def test_splits_disjoint_sized_by_weight_and_deterministic():
    cfg = ArithConfig(levels=[1, 2], weights=[0.6, 0.4], train_size=120, eval_size=64, seed=0)
    train, held_out = arith_splits(cfg)
    assert len(train) == 120 and len(held_out) == 64
    assert not {e.problem for e in train} & {e.problem for e in held_out}
    assert len({e.problem for e in train}) == 120
    levels = [e.meta["level"] for e in train], [e.meta["level"] for e in held_out]
    assert (levels[0].count(1), levels[0].count(2), levels[1].count(1), levels[1].count(2)) == (72, 48, 38, 26)
    assert arith_splits(cfg) == (train, held_out)
    other_train, other_eval = arith_splits(ArithConfig(seed=1))
    assert [e.problem for e in other_eval] != [e.problem for e in held_out]
    assert not {e.problem for e in other_train} & {e.problem for e in other_eval}


def test_whole_level_can_be_split_without_overlap():
    train, held_out = arith_splits(ArithConfig(levels=[1], weights=[1.0], train_size=90, eval_size=32))
    assert {e.problem for e in train} | {e.problem for e in held_out} == {text for text, _ in level_space(1)}


def test_split_counts_largest_remainder():
    assert split_counts(150, [0.7, 0.3]) == [105, 45]
    assert split_counts(10, [1, 1, 1]) == [4, 3, 3]
    assert split_counts(5, [0.5, 0.25, 0.25]) == [3, 1, 1]
    assert split_counts(0, [2, 1]) == [0, 0]


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"levels": [1, 5], "weights": [1, 1]}, r"data.arith.levels must be distinct levels from \[1, 2, 3, 4\]"),
        ({"levels": [1, 1], "weights": [1, 1]}, r"data.arith.levels must be distinct"),
        ({"levels": [], "weights": []}, r"data.arith.levels must be a non-empty list"),
        ({"weights": [1.0]}, r"data.arith.weights must list one weight per level \(2\)"),
        ({"weights": [1.0, 0]}, r"data.arith.weights must all be > 0"),
        ({"train_size": -1}, r"data.arith.train_size must be an integer >= 0, got -1"),
        ({"train_size": 200}, r"data.arith: level 1 has 122 problems but its weight asks for 38 eval \+ 120 train"),
    ],
)
def test_bad_curriculum_is_a_config_error(changes, message):
    with pytest.raises(ConfigError, match=message):
        arith_splits(ArithConfig(**changes))

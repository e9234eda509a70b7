"""Words beside an answer's math: unit words pass, anything else makes the answer a hedge."""

import pytest

from tokenpo.rewards.prose import hedged, only_units


@pytest.mark.parametrize(
    "text, expected",
    [(" cm ", True), ("square inches", True), (" km/h.", True), ("Dollars", True), (" € ", True), ("", True),
     ("apples", False), (" or ", False), ("is wrong", False), ("(cm)", False), ("70", False), ("not", False)],
)
def test_only_units(text, expected):
    assert only_units(text) is expected


@pytest.mark.parametrize(
    "answer, expected",
    [(r"69 \text{ (or 70)}", True), (r"69 \text{ (maybe seventy)}", True), (r"69\ (\text{or}\ 70)", True),
     (r"\text{not } 69", True), (r"69 \mbox{ or } 70", True), (r"69 \text{ or {70}}", True),
     (r"69 \text{ (or 70", True),  # unclosed: the prose runs to the end
     (r"5.4 \text{ cents}", False), (r"864 \mbox{ inches}^2", False), (r"\frac{270}7\text{ degrees}", False),
     # word answers are compared as text by math-verify, and plain math has no prose
     (r"\text{(C)}", False), (r"\text{Evelyn}", False), (r"x \in [-2,7]", False), (r"2ab + \sin x", False),
     # hedge words anywhere, bare in math mode (math-verify reads `not 0` as n*o*t*0) or inside a word answer
     (r"not 0", True), (r"0 is wrong", True), (r"\text{69 or 70}", True), (r"\mathrm{or}", True)],
)
def test_hedged(answer, expected):
    assert hedged(answer) is expected

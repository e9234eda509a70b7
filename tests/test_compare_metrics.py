"""scripts/compare_metrics.py: bit for bit by default; with tolerances, numbers within the relative or the absolute
distance agree, anything else (strings, a key or step in one run only) must be equal."""

from __future__ import annotations

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("compare_metrics", REPO / "scripts" / "compare_metrics.py")
compare_metrics = importlib.util.module_from_spec(spec)
spec.loader.exec_module(compare_metrics)


def test_numbers_agree_within_either_tolerance_and_nothing_else_does():
    same = compare_metrics.same
    assert same(1.0, 1.0, 0.0) and not same(1.0, 1.0 + 1e-12, 0.0)
    assert same(1.0, 1.000009, 1e-5) and not same(1.0, 1.00002, 1e-5)
    assert same(4.23e-9, 4.40e-9, 1e-5, atol=1e-9) and not same(4.23e-9, 4.40e-9, 1e-5)
    assert not same("a", "b", 1.0, 1.0) and not same(True, False, 1.0, 1.0)


def test_differences_name_each_step_and_key_apart():
    a = {1: {"step": 1, "loss": 1.0, "timing/step_s": 3.0}, 2: {"step": 2, "loss": 2.0}}
    b = {1: {"step": 1, "loss": 1.0 + 1e-7, "timing/step_s": 9.0}, 3: {"step": 3, "loss": 2.0}}
    lines = compare_metrics.differences(a, b, ("timing/",), rtol=1e-6)
    assert lines == ["step 2: only in a", "step 3: only in b"]
    assert compare_metrics.differences(a, b, ("timing/",)) == ["step 2: only in a", "step 3: only in b",
                                                                 "step 1: loss: 1.0 != 1.0000001"]

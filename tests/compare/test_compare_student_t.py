"""Student-t tail and quantile against closed forms (df 1 and 2), printed tables and mpmath (40 digits)."""

import math

import pytest

from tokenpo.compare.student_t import regularized_incomplete_beta, t_quantile, t_two_sided_p


def test_t_quantile_matches_printed_tables_and_closed_forms():
    table = {1: 12.706, 2: 4.303, 4: 2.776, 9: 2.262, 30: 2.042}
    assert {df: round(t_quantile(0.975, df), 3) for df in table} == table
    # df 1: Cauchy, tan(pi (p - 1/2)); df 2: (2p - 1) / sqrt(2 p (1 - p))
    assert t_quantile(0.975, 1) == pytest.approx(math.tan(0.475 * math.pi), abs=1e-9)
    assert t_quantile(0.975, 2) == pytest.approx(0.95 / math.sqrt(2 * 0.975 * 0.025), abs=1e-12)
    # a Welch-style fractional df, against mpmath
    assert t_quantile(0.975, 3.5) == pytest.approx(2.9400886379827297938, abs=1e-9)
    assert t_quantile(0.5, 7) == 0.0


def test_two_sided_p_matches_closed_forms_and_mpmath():
    # df 1: 1 - 2 atan(|t|) / pi; df 2: 1 - |t| / sqrt(2 + t^2)
    assert t_two_sided_p(1.7, 1) == pytest.approx(1 - 2 * math.atan(1.7) / math.pi, abs=1e-12)
    assert t_two_sided_p(-0.8, 2) == pytest.approx(1 - 0.8 / math.sqrt(2.64), abs=1e-12)
    assert t_two_sided_p(2.5, 7.3) == pytest.approx(0.039650234665600470849, abs=1e-12)
    assert t_two_sided_p(0.3, 50) == pytest.approx(0.76542088025530323788, abs=1e-12)
    assert t_two_sided_p(0.0, 3) == 1.0


def test_incomplete_beta_on_both_sides_of_the_switch_point():
    # (a + 1) / (a + b + 2) = 0.7 for a = 2.5, b = 0.5: 0.3 uses the fraction, 0.9 the symmetry
    assert regularized_incomplete_beta(0.3, 2.5, 0.5) == pytest.approx(0.018927124071945651653, abs=1e-13)
    assert regularized_incomplete_beta(0.9, 2.5, 0.5) == pytest.approx(0.48958974456442755456, abs=1e-13)
    assert regularized_incomplete_beta(0.0, 2.5, 0.5) == 0.0 and regularized_incomplete_beta(1.0, 2.5, 0.5) == 1.0


def test_t_quantile_rejects_lower_tail_probabilities():
    with pytest.raises(ValueError, match="0.5 <= prob < 1"):
        t_quantile(0.025, 3)

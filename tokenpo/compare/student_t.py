"""Student's t distribution in pure Python (no scipy dependency): the two-sided tail probability through the
regularized incomplete beta function, and the quantile by bisection on it."""

from __future__ import annotations

import math

# Lentz's method: stand-in for a zero denominator, relative accuracy, and an iteration bound far above what
# the a = df/2, b = 1/2 arguments of a t tail need (tens of iterations)
TINY = 1e-300
EPS = 1e-15
MAX_ITERATIONS = 10_000


def beta_continued_fraction(x: float, a: float, b: float) -> float:
    """The continued fraction of I_x(a, b), evaluated by the modified Lentz method (Numerical Recipes §6.4)."""
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > TINY else TINY)
    fraction = d
    for m in range(1, MAX_ITERATIONS + 1):
        # the even term d_{2m}, then the odd term d_{2m+1}
        for numerator in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                          -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > TINY else TINY)
            c = 1.0 + numerator / c
            c = c if abs(c) > TINY else TINY
            fraction *= d * c
        if abs(d * c - 1.0) < EPS:
            return fraction
    raise ArithmeticError(f"incomplete beta continued fraction did not converge (x={x}, a={a}, b={b})")


def regularized_incomplete_beta(x: float, a: float, b: float) -> float:
    """I_x(a, b) for 0 <= x <= 1 and a, b > 0."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    # the fraction converges fast only below the mean of Beta(a, b); above it use I_x(a, b) = 1 - I_{1-x}(b, a)
    if x > (a + 1.0) / (a + b + 2.0):
        return 1.0 - regularized_incomplete_beta(1.0 - x, b, a)
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    return math.exp(log_front) * beta_continued_fraction(x, a, b) / a


def t_two_sided_p(t: float, df: float) -> float:
    """P(|T| >= |t|) for T ~ Student t with df degrees of freedom (df may be fractional: Welch)."""
    return regularized_incomplete_beta(df / (df + t * t), df / 2.0, 0.5)


def t_quantile(prob: float, df: float) -> float:
    """The t with P(T <= t) = prob, for 0.5 <= prob < 1 (e.g. t_{0.975, df} for a 95 % two-sided interval)."""
    if not 0.5 <= prob < 1.0:
        raise ValueError(f"t_quantile needs 0.5 <= prob < 1, got {prob}")
    # two-sided tail 2(1 - prob) = I_x(df/2, 1/2) with x = df / (df + t^2), increasing in x: bisect on x
    tail, low, high = 2.0 * (1.0 - prob), 0.0, 1.0
    while True:
        mid = 0.5 * (low + high)
        if mid in (low, high):  # the interval is down to adjacent floats
            break
        if regularized_incomplete_beta(mid, df / 2.0, 0.5) < tail:
            low = mid
        else:
            high = mid
    return math.sqrt(df * (1.0 - mid) / mid)

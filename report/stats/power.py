"""Power of a verdict: the probability that an interval read at a look decides a hypothesis, for the planner
(report.planning.block_planner). Pure.

A run of n blocks reads its interval as mean +- c * s / sqrt(n), with c the look's critical value on n - 1 df
(report.stats.sequential) and s the blocks' own SD, itself random: s / sigma = sqrt(V / (n - 1)), V chi-square. The
power is averaged over V by quadrature (the noncentral t, computed directly), so a run's own SD estimate on
few blocks is priced in. The planner's sigma is an estimate from earlier runs with its own df; it is taken at
an upper confidence bound (chi-square), so that a planner's SD that came out low does not promise power the
run will not have.

Two shapes of decision: a truth at a distance from the one edge (or threshold) it must clear (one-sided),
and a truth at the centre of a band whose both edges must be cleared (two one-sided tests).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import lru_cache

from report.stats.intervals import bisect_quantile

SD_CONFIDENCE = 0.8  # the planner's SD at its one-sided 80% upper confidence bound
_STEPS = 128  # Simpson intervals of the chi quadrature (even)


def _gamma_p(a: float, x: float) -> float:
    """Regularized lower incomplete gamma P(a, x): series below a + 1, continued fraction above."""
    if x <= 0.0:
        return 0.0
    lead = math.exp(-x + a * math.log(x) - math.lgamma(a))
    if x < a + 1.0:
        term = total = 1.0 / a
        k = a
        for _ in range(1000):
            k += 1.0
            term *= x / k
            total += term
            if abs(term) < abs(total) * 1e-15:
                break
        return total * lead
    tiny = 1e-300
    b, c, d = x + 1.0 - a, 1.0 / tiny, 1.0 / (x + 1.0 - a)
    h = d
    for i in range(1, 1000):
        an = -i * (i - a)
        b += 2.0
        d = an * d + b
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = b + an / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return 1.0 - lead * h


def chi2_cdf(x: float, df: float) -> float:
    return _gamma_p(df / 2.0, x / 2.0)


def chi2_quantile(p: float, df: float) -> float:
    """The p quantile of chi-square with `df` (> 0) degrees of freedom, by bisection."""
    if not 0.0 < p < 1.0 or df <= 0:
        raise ValueError(f"need 0 < p < 1 and df > 0, got p={p}, df={df}")
    return bisect_quantile(lambda x: chi2_cdf(x, df), p, max(1.0, df))


def sd_upper(sd: float, df: float | None, confidence: float = SD_CONFIDENCE) -> float:
    """The one-sided upper confidence bound of an SD estimated on `df` degrees of freedom:
    sd * sqrt(df / chi2(1 - confidence, df)). df None: the SD is taken as known."""
    if df is None:
        return sd
    if df <= 0:
        raise ValueError(f"an SD estimate needs df > 0, got {df}")
    return sd * math.sqrt(df / chi2_quantile(1.0 - confidence, df))


def _phi(x: float) -> float:
    """The standard normal CDF."""
    return 0.5 * math.erfc(-x / math.sqrt(2.0))


@lru_cache(maxsize=512)
def _nodes(df: int) -> tuple[tuple[float, float], ...]:
    """(weight, s / sigma) of the quadrature of E[f(s / sigma)] for an SD on `df` degrees of freedom:
    s / sigma = y / sqrt(df), y chi-distributed (density y^(df-1) e^(-y^2/2) / (2^(df/2-1) Gamma(df/2))), by
    Simpson's rule on [0, sqrt(df) + 9]; nodes where the density is 0 are left out. Cached per df: the
    planner asks for the same df over and over."""
    top = math.sqrt(df) + 9.0
    h = top / _STEPS
    log_norm = (df / 2.0 - 1.0) * math.log(2.0) + math.lgamma(df / 2.0)
    out = []
    for i in range(_STEPS + 1):
        y = i * h
        if y == 0.0 and df > 1:
            continue  # the density is 0 there
        density = math.exp((df - 1) * math.log(y) - y * y / 2.0 - log_norm) if y > 0 else math.exp(-log_norm)
        weight = 1 if i in (0, _STEPS) else (4 if i % 2 else 2)
        out.append((weight * density * h / 3.0, y / math.sqrt(df)))
    return tuple(out)


def _over_chi(df: int, f: Callable[[float], float]) -> float:
    """E[f(s / sigma)] where s is an SD on `df` degrees of freedom (`_nodes`)."""
    return sum(w * f(r) for w, r in _nodes(df))


def power_to_clear(distance: float, sd: float, n: int, critical: float) -> float:
    """P(the interval of n blocks, mean +- critical * s / sqrt(n), lies wholly beyond an edge `distance`
    (relative, log scale) from the truth) for blocks of true SD `sd`: the noncentral t's tail."""
    if n < 2:
        return 0.0
    if sd <= 0:
        return 1.0 if distance > 0 else 0.0
    shift = distance * math.sqrt(n) / sd
    return sum(w * _phi(shift - critical * r) for w, r in _nodes(n - 1))


def power_inside(tolerance: float, sd: float, n: int, critical: float) -> float:
    """P(the interval of n blocks lies wholly inside a band of +-`tolerance` around the truth): both one-sided
    tests pass at once."""
    if n < 2:
        return 0.0
    if sd <= 0:
        return 1.0 if tolerance > 0 else 0.0
    scale = math.sqrt(n) / sd

    def inside(r: float) -> float:
        room = tolerance * scale - critical * r
        return max(0.0, 2.0 * _phi(room) - 1.0)

    return _over_chi(n - 1, inside)

"""The power of a verdict (report.stats.power): the chi-square and noncentral-t quadrature against known values and
against seeded numpy simulations of the interval the scoring reads, and the SD's upper confidence bound."""

from __future__ import annotations

import math

import numpy as np
import pytest

from report.stats.intervals import t_quantile
from report.stats.power import chi2_cdf, chi2_quantile, power_inside, power_to_clear, sd_upper

SIMS = 200_000


def _blocks(n: int, sd: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((SIMS, n)) * sd
    return x.mean(axis=1), x.std(axis=1, ddof=1) / math.sqrt(n)


def _tol(p: float) -> float:
    return 4 * math.sqrt(p * (1 - p) / SIMS) + 1e-4


@pytest.mark.parametrize(("n", "distance", "sd", "alpha"), [(2, 0.05, 0.0086, 0.05), (4, 0.01, 0.008, 0.05),
                                                            (8, 0.006, 0.0086, 0.04), (3, 0.02, 0.0086, 0.0025)])
def test_power_to_clear_matches_a_simulation(n: int, distance: float, sd: float, alpha: float) -> None:
    c = t_quantile(1 - alpha / 2, n - 1)
    mean, se = _blocks(n, sd, seed=n)
    simulated = float(np.mean(mean + distance - c * se > 0))  # the truth `distance` beyond the edge at 0
    assert power_to_clear(distance, sd, n, c) == pytest.approx(simulated, abs=_tol(simulated))


@pytest.mark.parametrize(("n", "tolerance", "sd"), [(3, 0.02, 0.0086), (6, 0.01, 0.0086), (12, 0.005, 0.0065)])
def test_power_inside_matches_a_simulation(n: int, tolerance: float, sd: float) -> None:
    c = t_quantile(0.975, n - 1)
    mean, se = _blocks(n, sd, seed=100 + n)
    simulated = float(np.mean(np.abs(mean) + c * se < tolerance))  # both edges cleared
    assert power_inside(tolerance, sd, n, c) == pytest.approx(simulated, abs=_tol(simulated))


def test_power_edges() -> None:
    c = t_quantile(0.975, 4)
    assert power_to_clear(0.01, 0.01, 1, c) == 0.0 and power_inside(0.01, 0.01, 1, c) == 0.0  # no interval
    assert power_to_clear(0.01, 0.0, 2, c) == 1.0 and power_to_clear(0.0, 0.0, 2, c) == 0.0
    assert power_inside(0.01, 0.0, 2, c) == 1.0 and power_inside(0.0, 0.0, 2, c) == 0.0
    assert power_to_clear(0.0, 0.01, 5, c) < 0.025  # a truth on the edge: at most the one-sided error rate
    assert power_to_clear(1.0, 0.01, 5, c) == pytest.approx(1.0)
    assert power_to_clear(0.01, 0.01, 10, c) > power_to_clear(0.01, 0.01, 5, c)  # more blocks, more power


def test_chi_square() -> None:
    assert chi2_cdf(3.841458820694124, 1) == pytest.approx(0.95, abs=1e-9)
    assert chi2_quantile(0.2, 5) == pytest.approx(2.342534, abs=1e-6)
    assert chi2_quantile(0.975, 1) == pytest.approx(5.023886, abs=1e-6)
    assert chi2_quantile(0.5, 100) == pytest.approx(99.334129, abs=1e-5)
    assert chi2_cdf(0.0, 3) == 0.0 and chi2_cdf(-1.0, 3) == 0.0
    for bad in ((0.0, 3.0), (1.0, 3.0), (0.5, 0.0)):
        with pytest.raises(ValueError):
            chi2_quantile(*bad)


def test_sd_upper_bound() -> None:
    """One-sided 80% upper bound sd * sqrt(df / chi2(0.2, df)): wide on few df, near the SD on many."""
    assert sd_upper(1.0, 5) == pytest.approx(math.sqrt(5 / 2.342534), rel=1e-6)
    assert sd_upper(2.0, 5) == pytest.approx(2 * sd_upper(1.0, 5))
    assert sd_upper(1.0, 1) > sd_upper(1.0, 5) > sd_upper(1.0, 100) > 1.0
    assert sd_upper(1.0, 5, 0.9) > sd_upper(1.0, 5)
    assert sd_upper(1.0, None) == 1.0
    with pytest.raises(ValueError):
        sd_upper(1.0, 0)
    rng = np.random.default_rng(7)  # it covers the true SD 80% of the time
    s = np.sqrt(rng.chisquare(4, 20_000) / 4)
    covered = float(np.mean(s * math.sqrt(4 / chi2_quantile(0.2, 4)) >= 1.0))
    assert covered == pytest.approx(0.8, abs=0.012)

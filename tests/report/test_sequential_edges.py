"""The stopping rule's math at its edges (report.stats.sequential): the schedule's clamps, the last look and a look
past it, a run's share of the ledger, and the multiplier computed at any alpha but exactly 5% (the fixed
design's cached one). Exact values from report.stats.intervals.t_quantile."""

from __future__ import annotations

import pytest

from report.stats.intervals import fixed_critical, t_quantile
from report.stats.sequential import ALPHA, look_alpha, look_confidence, look_critical, looks


def test_the_schedule_starts_at_two_and_never_past_the_budget() -> None:
    assert looks(1, 4) == (2, 3, 4) and looks(3, 5) == (3, 4, 5)
    assert looks(6, 4) == (4,) and looks(4, 4) == (4,)  # a first look past the budget: the budget's last block


def test_the_last_look_and_any_after_it_spend_the_final_share() -> None:
    assert look_alpha(8, 8) == pytest.approx(0.04) and look_alpha(9, 8) == look_alpha(8, 8)
    assert look_alpha(7, 8) == pytest.approx(0.01 / 6)  # 20% of 5% over the six looks before the last
    assert look_alpha(3, 5, first=5) == pytest.approx(0.05)  # a budget of one look: the whole alpha
    assert look_alpha(4, None) == ALPHA == 0.05


def test_a_runs_share_scales_every_look() -> None:
    assert look_alpha(2, None, share=0.5) == pytest.approx(0.025)
    assert look_alpha(5, 5, first=5, share=1 / 3) == pytest.approx(0.05 / 3)
    assert look_alpha(8, 8, share=0.5) == pytest.approx(0.02) and look_alpha(2, 8, share=0.5) == pytest.approx(0.005 / 6)
    assert look_confidence(8, 8, share=0.5) == "98%" and look_confidence(2, None, share=0.5) == "97.5%"
    assert look_confidence(8, 8, 2) == "96%" and look_confidence(3, 8, 3) == "99.8%"
    assert look_confidence(2, 3) == "99%"  # the first look after block 2 unless told otherwise


def test_only_exactly_five_percent_is_the_fixed_multiplier() -> None:
    assert look_critical(5, None) is fixed_critical and look_critical(4, 4, first=4) is fixed_critical
    half = look_critical(5, None, share=0.5)
    assert half is not fixed_critical
    for df in (1.0, 2.0, 7.5, 30.0):
        assert half(df) == t_quantile(1 - 0.025 / 2, df)
    final = look_critical(8, 8)
    assert final(3.0) == t_quantile(1 - 0.04 / 2, 3.0) and final(3.0) > fixed_critical(3.0)


def test_the_multiplier_reads_df_to_six_decimals() -> None:
    """Fractional df (Welch) are rounded to 1e-6 before the quantile (and its cache): a difference below that
    is the same multiplier, one above it is not."""
    critical = look_critical(3, 8)
    assert critical(4.0000004) == critical(4.0) == t_quantile(1 - (0.01 / 6) / 2, 4.0)
    assert critical(4.000001) == t_quantile(1 - (0.01 / 6) / 2, 4.000001) != critical(4.0)

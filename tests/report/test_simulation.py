"""The stopping rule and the verdict rule keep their error rates where production uses them: simulated runs
(tests.report.simulate) compiled from a study file, extended block by block while report.scoring.scoring.undecided
asks for more, scored by report.scoring.scoring.score_study. With the truth on a band's edge, a range's edge or a
relation's threshold, false "confirmed" and false "refuted" are each at most 2.5% + 4 Monte Carlo SE. The designs
that pair their arms in blocks run in bulk (tests.report.simulate_fast: numpy, every run of a case at once, each
look at report.stats.sequential's multiplier), checked verdict for verdict against production scoring on the same
draws; the others (a server per point, one launch per arm) run through production scoring. Runs written to a
real DuckDB file score exactly as the in-memory runs.

The suite's power, computed (binomial tails summed exactly: simulate.binomial_above, binomial_at_most; checked
by test_the_suite_power_is_as_stated). The bulk draws n = 200,000 runs per case; the criterion, 2.5% + 4 SE =
2.640%, allows 5,279 false verdicts of one kind. A correct rule (each rate at most 2.5%) breaks one kind with
P(X > 5,279 | n, 2.5%) = 3.6e-5; over the suite's 20 bulk rates, 6 rates at 2,000 runs (limit 77: 1.2e-4 each)
and 6 at 400 (limit 22: 2.4e-4 each) it fails at most 0.29% of CI runs (the union of the tails). A rule that
spends 6% (report.stats.sequential.ALPHA = 0.06): a fixed design read at 94% (each false rate 3.0%) passes with
P(X <= 5,279 | n, 3.0%) = 2.8e-22, the sequential sentinel with every look, its early ones included, at 1.2 x
alpha (2.83%) with 1.1e-7: it fails more than 99.99% of CI runs, on each design alone. (Before: 2,000
production runs per fixed design against a 3.55% limit caught a fixed design read at 94% 7-10% of the time,
and a changed ALPHA never reached a fixed design: report.stats.sequential.look_critical returned the 95% multiplier
whenever alpha equalled ALPHA.)
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest

from report.stats import sequential
from tests.report.simulate import (
    ABOVE,
    BAND,
    BROKEN_RATES,
    BULK_SIMS,
    FIXED_SENTINEL,
    NOMINAL,
    SENTINEL,
    Case,
    Rates,
    binomial_above,
    binomial_at_most,
    cases,
    in_duckdb,
    in_memory,
    models_read_once,
    planner_checks,
    prepare,
    seeds,
    simulate,
)
from tests.report.simulate_fast import agree, bulk, paired

BULK = [pytest.param(c, id=f"{c.edge}|{c.design}") for c in cases() if paired(c)]
SCORED = [pytest.param(c, id=f"{c.edge}|{c.design}") for c in cases() if not paired(c)]
AGREE_RUNS = 200  # runs of each paired case scored both ways


def _says(rates: Rates) -> str:
    case = rates.case
    return (f"{case.edge}, {case.design}: false confirmed {rates.false_confirmed:.4f}, false refuted "
            f"{rates.false_refuted:.4f}, allowed {rates.tolerance:.4f} ({rates.sims} runs)")


@pytest.mark.parametrize("case", SCORED)
def test_false_verdicts_at_the_edge_stay_within_the_nominal_rate(case: Case) -> None:
    rates = simulate(case, workers=2)
    assert rates.holds, _says(rates)


@pytest.mark.parametrize("case", BULK)
def test_false_verdicts_of_paired_designs_stay_within_the_nominal_rate(case: Case) -> None:
    rates = bulk(case)
    assert rates.sims == BULK_SIMS and rates.holds, _says(rates)


@pytest.mark.parametrize("case", BULK)
def test_the_bulk_is_production_scoring(case: Case, tmp_path: Path) -> None:
    """The same draws, block by block through report.scoring.scoring and in bulk: the same verdict at the same number
    of blocks, run for run."""
    with models_read_once():
        assert agree(prepare(case, tmp_path), AGREE_RUNS, case.seed + 100) == []


@pytest.mark.parametrize("case", [SENTINEL, FIXED_SENTINEL], ids=["sequential, 2 looks", "fixed"])
def test_a_rule_spending_six_percent_fails_the_criterion(case: Case, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Alpha 6% instead of 5% (report.stats.sequential.ALPHA): a fixed design is read at 94%, a sequential one at 1.2 x
    alpha at every look; both designs' false rates pass the criterion, and production scoring reads them so
    too (the same verdicts as the bulk, run for run)."""
    monkeypatch.setattr(sequential, "ALPHA", 0.06)
    rates = bulk(case)
    assert not rates.holds, _says(rates)
    assert min(rates.confirmed, rates.refuted) > rates.limit  # both kinds, as the power says
    with models_read_once():
        assert agree(prepare(case, tmp_path), 100, case.seed + 200) == []


def test_the_suite_power_is_as_stated() -> None:
    """The module docstring's arithmetic: limits and binomial tails at n = 200,000, 2,000 and 400."""
    big = Rates(SENTINEL, BULK_SIMS, 0, 0)
    assert (BULK_SIMS, round(100 * big.tolerance, 3), big.limit) == (200_000, 2.64, 5279)
    assert f"{binomial_above(big.limit, BULK_SIMS, NOMINAL):.1e}" == "3.6e-05"
    assert f"{binomial_at_most(big.limit, BULK_SIMS, BROKEN_RATES[FIXED_SENTINEL]):.1e}" == "2.8e-22"
    assert f"{binomial_at_most(big.limit, BULK_SIMS, BROKEN_RATES[SENTINEL]):.1e}" == "1.1e-07"
    small = {n: Rates(SENTINEL, n, 0, 0).limit for n in (2000, 400)}
    assert small == {2000: 77, 400: 22}
    tails = {n: binomial_above(limit, n, NOMINAL) for n, limit in small.items()}
    assert (f"{tails[2000]:.1e}", f"{tails[400]:.1e}") == ("1.2e-04", "2.4e-04")
    scored = [c for c in cases() if not paired(c)]
    assert len([c for c in cases() if paired(c)]) == 10 and sorted(c.sims for c in scored) == [400] * 3 + [2000] * 3
    alarm = 20 * binomial_above(big.limit, BULK_SIMS, NOMINAL) + 6 * tails[2000] + 6 * tails[400]
    assert round(100 * alarm, 2) == 0.29
    assert binomial_above(5, 10, 0.5) + binomial_at_most(5, 10, 0.5) == pytest.approx(1.0)


def test_the_criterion_is_nominal_plus_four_standard_errors() -> None:
    case = Case(BAND, "edge", 1.02)
    tol = NOMINAL + 4 * math.sqrt(NOMINAL * (1 - NOMINAL) / 10_000)
    at = math.floor(tol * 10_000)  # the most false verdicts of 10,000 that still hold
    assert Rates(case, 10_000, at, at).holds and Rates(case, 10_000, at, at).limit == at
    assert not Rates(case, 10_000, at + 1, 0).holds
    assert not Rates(case, 10_000, 0, at + 1).holds
    assert Rates(case, 10_000, 0, 0).decided == 0 and Rates(case, 10, 3, 4).decided == 0.7


def test_the_simulation_decides_where_the_truth_is_clear() -> None:
    """Not a simulation that never decides: a truth at the band's centre is confirmed, one far outside is
    refuted, and a truth on an edge splits."""
    centre = simulate(Case(BAND, "centre", 1.0, launches=6, seed=21), 200)
    outside = simulate(Case(BAND, "outside", 1.10, launches=3, seed=22), 200)
    above = simulate(Case(ABOVE, "above", 1.08, launches=3, seed=23), 200)
    assert centre.confirmed > 190 and centre.refuted == 0
    assert outside.refuted == 200 and above.confirmed == 200


def test_a_sequential_run_adds_blocks_only_while_undecided(tmp_path: Path) -> None:
    """The simulated runner: blocks past the required ones only while undecided, never past the budget."""
    case = Case(BAND, "past the edge", 1.035, launches=2, budget=6, seed=24)
    with models_read_once():
        prep = prepare(case, tmp_path)
        blocks = [in_memory(prep, k).n for k in seeds(case, 100)]
        far = prepare(replace(case, truth=1.5), tmp_path)
        # refuted by block 3 (the look after block 2 reads at 99.75% on 1 df, a multiplier of ~250): no more
        assert {(s.n, s.verdict) for s in (in_memory(far, k) for k in seeds(case, 20))} == {(2, "refuted"),
                                                                                          (3, "refuted")}
    assert set(blocks) <= set(range(2, 7)) and 6 in blocks and len(set(blocks)) > 2


CHECKED = [Case(BAND, "band", 1.02, budget=6, seed=31), Case(ABOVE, "relation", 1.0, server="per-point",
                                                               repeats=2, budget=4, tails="t3", seed=32),
           Case('{ ratio = ["a", "b"], range = [1.04, 1.06] }', "range", 1.04, launches=1, repeats=3, seed=33),
           Case(BAND, "band", 0.98, launches=3, repeats=2, seed=34)]


@pytest.mark.parametrize("case", CHECKED, ids=lambda c: c.design)
def test_duckdb_and_memory_give_identical_scores(case: Case, tmp_path: Path) -> None:
    """The same seeds through a real DuckDB file (each point committed by runner.store, the run read back by
    report.results.read_run) and through in-memory records: equal scores, field for field; and the bulk's
    verdict-only scoring (explain=False) gives the same verdict and interval, without the planner's texts."""
    with models_read_once():
        prep = prepare(case, tmp_path)
        for k in seeds(case, 8):
            stored = in_duckdb(prep, k, tmp_path / "sim.duckdb")
            assert stored == in_memory(prep, k)
            assert stored.n >= 1 and stored.verdict in ("confirmed", "refuted", "inconclusive")
            bare = in_memory(prep, k, explain=False)
            assert (bare.verdict, bare.verdict_spec, bare.ci_low, bare.ci_high, bare.n) == (
                stored.verdict, stored.verdict_spec, stored.ci_low, stored.ci_high, stored.n)


def _se(p: float, n: int) -> float:
    return math.sqrt(p * (1 - p) / n)


def test_runs_at_the_planned_blocks_decide_with_the_power_planned() -> None:
    """report.planning.block_planner, validated by the simulation: runs of the blocks it recommends for 80% (95%)
    power decide at least that often (3 Monte Carlo SE), whether the truth is at the prediction or past
    an edge, and with the SD from a pilot on 4 df taken at its upper bound. Planned as if that pilot SD
    were the truth, as the planner did before, they fall short."""
    found = {(p.what, power): p for p, power in planner_checks(runs=1000)}
    for (what, power), p in found.items():
        if "as if known" in what:
            continue
        assert p.decided >= power - 3 * _se(power, 1000), (what, power, p.decided, p.blocks[:5])
    naive = found[("blocks_needed, pilot SD as if known", 0.8)]
    assert naive.decided < 0.8 - 3 * _se(0.8, 1000), naive.decided
    bounded = found[("blocks_needed, pilot SD on 4 df", 0.8)]
    assert sum(bounded.blocks) > sum(naive.blocks)  # the same pilots: the bound asks for more blocks

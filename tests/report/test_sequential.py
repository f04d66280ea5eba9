"""The stopping rule keeps the false-refuted rate honest under peeking after every block (simulation), read
the way scoring reads a look: the look's critical value (report.stats.sequential) on the block ratios, then the
verdict rule (report.stats.verdict); and the runner's hook asks for another block only while that is undecided."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from pathlib import Path

import pytest

from report.results import RunData
from report.scoring.scoring import score_study, undecided
from report.stats.intervals import Obs, fixed_critical, ratio_interval
from report.stats.sequential import look_alpha, look_critical, looks
from report.stats.verdict import judge
from tests.report.test_scoring_branches import hyp, launch, pid, point, run, study

LOW = 0.98  # the band's low edge
EDGE = 1.02  # the band's high edge; the truth is placed exactly on it
SIGMA = 0.0065  # SD of one block's log ratio (plan-shape.md's H200 figure)
SIMS = 5000
NOMINAL = 0.025  # a false "refuted" above the band: one side of a 95% two-sided interval
TOL = 3 * math.sqrt(NOMINAL * (1 - NOMINAL) / SIMS)  # Monte Carlo tolerance, 3 standard errors


def _block(b: int, d: float) -> tuple[Obs, Obs]:
    return Obs(f"t/L{b}", math.exp(d), f"t/L{b}", b), Obs(f"b/L{b}", 1.0, f"b/L{b}", b)


Verdict = Callable[[int, list[Obs], list[Obs]], str | None]  # after block b: a look's verdict, None: no look


def _simulate(max_blocks: int, look: Verdict, seed: int) -> float:
    """Share of simulated runs (truth on the edge) that stop on "refuted" at one of their looks."""
    rng = random.Random(seed)
    hits = 0
    for _ in range(SIMS):
        top: list[Obs] = []
        bottom: list[Obs] = []
        for b in range(1, max_blocks + 1):
            t, u = _block(b, math.log(EDGE) + rng.gauss(0.0, SIGMA))
            top.append(t)
            bottom.append(u)
            verdict = look(b, top, bottom)
            if verdict is not None and verdict != "inconclusive":
                hits += verdict == "refuted"
                break
    return hits / SIMS


def _plain(top: list[Obs], bottom: list[Obs]) -> str:
    est = ratio_interval(top, bottom, fixed_critical)
    return judge("value", None, LOW, EDGE, est.ci_low, est.ci_high)


def _at_look(top: list[Obs], bottom: list[Obs], max_blocks: int, first: int) -> str:
    """The verdict at the look after the blocks so far, as scoring reads it under a budget of `max_blocks`
    blocks whose first look is after `first`."""
    blocks = len({o.block for o in [*top, *bottom]})
    est = ratio_interval(top, bottom, look_critical(blocks, max_blocks, first))
    return judge("value", None, LOW, EDGE, est.ci_low, est.ci_high)


def _false_refuted(max_blocks: int, peeks: tuple[int, ...], *, naive: bool, seed: int) -> float:
    """Looks after the blocks in `peeks`: plain t intervals (`naive`) or the stopping rule's."""

    def look(b: int, top: list[Obs], bottom: list[Obs]) -> str | None:
        if b not in peeks:
            return None
        return _plain(top, bottom) if naive else _at_look(top, bottom, max_blocks, 2)

    return _simulate(max_blocks, look, seed)


def test_alpha_is_spent_by_the_union_bound() -> None:
    for k, first in ((8, 2), (8, 3), (4, 2), (5, 5)):
        assert sum(look_alpha(n, k, first) for n in looks(first, k)) == pytest.approx(0.05)
    assert look_alpha(8, 8, 3) == pytest.approx(0.04) and look_alpha(1, 8, 3) == look_alpha(3, 8, 3)


def test_fixed_design_is_the_plain_t_interval() -> None:
    assert look_critical(5, None)(4) == pytest.approx(fixed_critical(4))
    assert look_critical(3, 8, 3)(2) > look_critical(8, 8, 3)(7) > fixed_critical(7)


def test_false_refuted_rate_stays_nominal_however_often_it_peeks() -> None:
    """1, 3 and 7 peeks (budgets of 2, 4 and 8 blocks, a look after every block from the second)."""
    rates = {k: _false_refuted(k, tuple(range(2, k + 1)), naive=False, seed=k) for k in (2, 4, 8)}
    assert all(r <= NOMINAL + TOL for r in rates.values()), rates
    assert rates[8] <= rates[2] + 2 * TOL and rates[4] <= rates[2] + 2 * TOL, rates  # no growth with peeks


def test_naive_repeated_t_intervals_fail_the_same_test() -> None:
    """Without the boundary, peeking after every block inflates false refutations past the nominal rate:
    the test above can fail."""
    once = _false_refuted(8, (8,), naive=True, seed=3)
    peeking = _false_refuted(8, tuple(range(2, 9)), naive=True, seed=4)
    assert abs(once - NOMINAL) <= TOL  # one look: a plain t interval is right
    assert peeking > NOMINAL + TOL and peeking > once + 2 * TOL


def test_a_look_decides_only_when_its_interval_clears_the_band() -> None:
    far = [_block(b, math.log(1.30) + 0.001 * (-1) ** b) for b in range(1, 4)]
    assert _at_look([t for t, _ in far], [u for _, u in far], 8, 3) == "refuted"
    near = [_block(b, math.log(EDGE) + 0.01 * (-1) ** b) for b in range(1, 5)]
    assert _at_look([t for t, _ in near], [u for _, u in near], 4, 2) == "inconclusive"
    assert _at_look([t for t, _ in near[:3]], [u for _, u in near[:3]], 4, 2) == "inconclusive"


def test_another_block_runs_only_while_undecided_and_within_the_budget(tmp_path: Path) -> None:
    """`undecided`, the runner's hook: the inconclusive hypotheses while the budget has blocks left; none
    once they are decided, once its blocks are spent, or for a fixed design."""
    loaded = study(tmp_path, hyp("near", "output_throughput", "{ arm = \"a\", concurrency = 1 }",
                                 "{ value = 100.0, tolerance = 0.05 }")
                   + hyp("far", "output_throughput", "{ arm = \"a\", concurrency = 4 }",
                         "{ value = 100.0, tolerance = 0.05 }"))
    near = {1: 100.0, 2: 110.0, 3: 105.0, 4: 104.0}  # straddles the edge 105 at every look
    far = {1: 200.0, 2: 201.0, 3: 202.0, 4: 203.0}  # refuted from the first look

    def data(blocks: int, budget: dict[str, int] | None = None) -> RunData:
        pts = [point("a", c, f"L{b}", values[b]) for c, values in ((1, near), (4, far)) for b in range(1, blocks + 1)]
        plan = {"launches": [launch(f"L{b}", b, [(pid("a", 1, f"L{b}"), 1, ""), (pid("a", 4, f"L{b}"), 1, "")])
                             for b in range(1, blocks + 1)],
                "design": {"launches": {"a": 2}} | ({"budget": budget} if budget else {})}
        return run(pts, plan=plan)

    assert undecided(loaded, data(3, {"blocks": 4})) == ("near",)
    assert undecided(loaded, data(4, {"blocks": 4})) == ()
    assert undecided(loaded, data(3)) == ()


def _extended_false_refuted(first: int, then: int, *, seed: int) -> float:
    """A fixed design of `first` blocks looked at once, and where that was inconclusive, a budget of
    `then` blocks added afterwards and its looks taken from the next block on (what resuming under a
    raised budget would do)."""

    def look(b: int, top: list[Obs], bottom: list[Obs]) -> str | None:
        if b < first:
            return None
        return _plain(top, bottom) if b == first else _at_look(top, bottom, then, first)

    return _simulate(then, look, seed)


def test_a_budget_raised_after_a_look_spends_the_error_rate_twice() -> None:
    """Why `--resume` refuses another budget once points are committed (runner.execute.run._same_stopping_rule):
    three blocks read at 95%, then four more under a budget of seven, read more false refutations than
    either rule alone allows."""
    extended = _extended_false_refuted(3, 7, seed=11)
    alone = _false_refuted(7, tuple(range(3, 8)), naive=False, seed=12)
    assert alone <= NOMINAL + TOL
    assert extended > NOMINAL + TOL and extended > alone + 2 * TOL, (extended, alone)


def test_a_prediction_that_cannot_be_evaluated_adds_no_blocks(tmp_path: Path) -> None:
    """A prediction that validated but no longer evaluates (its model's config broke since the run began)
    is invalid, not undecided: the budget adds no block for it. The same hypothesis evaluating is
    undecided (the failing case's clean twin)."""
    near = "{ arm = \"a\", concurrency = 1 }"
    loaded = study(tmp_path, hyp("near", "output_throughput", near, "{ value = \"model.params / model.params * 100\" }"))
    values = {1: 100.0, 2: 110.0, 3: 105.0}  # straddles the edge 105

    def data() -> RunData:
        pts = [point("a", 1, f"L{b}", values[b]) for b in values]
        plan = {"launches": [launch(f"L{b}", b, [(pid("a", 1, f"L{b}"), 1, "")]) for b in values],
                "design": {"launches": {"a": 2}, "budget": {"blocks": 4}}}
        return run(pts, plan=plan)

    assert undecided(loaded, data()) == ("near",)
    (tmp_path / "m" / "base" / "config.json").write_text("{ not json")
    assert undecided(loaded, data()) == ()
    assert score_study(loaded, data())[0].verdict == "invalid"

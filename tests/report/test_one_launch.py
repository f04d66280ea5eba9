"""No decided verdict without launch variation, labels with the level and look an interval was read at, the
look from the blocks the interval uses, and what would decide an undecided hypothesis."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from report.planning.block_planner import blocks_to_clear, blocks_within
from report.planning.deciding import gap, one_launch, straddling, unit_spread
from report.scoring.score_model import Why, interval_label, label_of
from report.scoring.scoring import undecided
from report.stats.intervals import Obs, fixed_critical, mean_interval, ratio_interval, t_quantile
from report.stats.sequential import look_critical
from tests.report.test_scoring_branches import TPUT, hyp, launch, pid, point, run, scores, study

ABOVE = "{ relation = \">\", value = 90.0 }"


def _blocks_plan(blocks: dict[int, list[str]], budget: int | None, first: int = 2) -> dict[str, Any]:
    """A plan with one launch of arm `a` per block, holding the c1 points named (by tag)."""
    plan: dict[str, Any] = {"launches": [launch(f"L{b}", b, [(pid("a", 1, tag), 1, "") for tag in tags])
                                         for b, tags in blocks.items()],
                            "design": {"launches": {"a": first}}}
    if budget is not None:
        plan["design"]["budget"] = {"blocks": budget}
    return plan


# ---- the rule: one launch vs two, one value ----------------------------------------------------------


def test_two_launches_decide_and_one_launch_of_the_same_values_does_not(tmp_path: Path) -> None:
    """The same two values, clearly above the threshold: on two launches (blocks 1 and 2) confirmed; as two
    repeats of one launch at most "inconclusive (one launch)"; a single value, never decided."""
    loaded = study(tmp_path, hyp("v", TPUT, "{ arm = \"a\", concurrency = 1 }", ABOVE))
    two = [point("a", 1, "L1", 100.0), point("a", 1, "L2", 101.0)]
    decided = scores(loaded, run(two, plan=_blocks_plan({1: ["L1"], 2: ["L2"]}, None)))["v"]
    assert (decided.verdict, decided.verdict_label, decided.n) == ("confirmed", "confirmed", 2)
    assert not decided.has(Why.ONE_LAUNCH)

    repeats = [point("a", 1, "r1", 100.0), point("a", 1, "r2", 101.0, repeat=2)]
    one = scores(loaded, run(repeats))["v"]
    assert (one.ci_low, one.ci_high) == (decided.ci_low, decided.ci_high)  # the same interval
    assert (one.verdict, one.verdict_spec, one.verdict_label) == ("inconclusive", "inconclusive",
                                                                 "inconclusive (one launch)")
    assert one.notes[-1].startswith("inconclusive (one launch): launch-to-launch variation is not in it (its 95% "
                                    "interval rests on the repeats of one launch per arm and would read confirmed)")

    value = scores(loaded, run([point("a", 1, "r1", 100.0)]))["v"]
    assert (value.n, value.verdict_label) == (1, "inconclusive (one launch)")
    assert value.notes[-1] == ("inconclusive (one launch): launch-to-launch variation is not in it (a single value, "
                               "no interval; alone it would read confirmed); what would decide it: at least 2 "
                               "launches per arm, for an interval between launches")


def test_a_refuting_interval_on_one_launch_is_not_refuted_and_neither_is_its_spec_verdict(tmp_path: Path) -> None:
    loaded = study(tmp_path, hyp("v", TPUT, "{ arm = \"a\", concurrency = 1 }", ABOVE))
    s = scores(loaded, run([point("a", 1, "r1", 50.0), point("a", 1, "r2", 51.0, repeat=2)]))["v"]
    assert (s.verdict, s.verdict_spec) == ("inconclusive", "inconclusive")
    assert (s.verdict_label, s.verdict_spec_label) == ("inconclusive (one launch)",) * 2
    assert "would read refuted" in s.notes[-1]


def test_label_of_only_marks_an_inconclusive_one_launch_verdict() -> None:
    assert label_of("inconclusive", True) == "inconclusive (one launch)"
    assert label_of("inconclusive", False) == "inconclusive"
    assert label_of("invalid", True) == "invalid" and label_of("not run", True) == "not run"


# ---- labels: the level and the look -------------------------------------------------------------------


@pytest.mark.parametrize(("blocks", "confidence", "label"), [
    (2, 1 - 0.01 / 3, "99.67% interval, look 2 of 5"),  # the first look
    (3, 1 - 0.01 / 3, "99.67% interval, look 3 of 5"),  # a middle look
    (5, 0.96, "96% interval, look 5 of 5"),  # the last look
])
def test_a_sequential_run_labels_its_interval_with_the_look_read_at(tmp_path: Path, blocks: int, confidence: float,
                                                                    label: str) -> None:
    """A budget of five blocks, first look after two: looks after blocks 2, 3, 4 (20% of alpha shared) and 5
    (80%). The label and the interval both use the look of the blocks measured."""
    loaded = study(tmp_path, hyp("v", TPUT, "{ arm = \"a\", concurrency = 1 }", ABOVE))
    values = {b: 100.0 + (b % 2) for b in range(1, blocks + 1)}
    pts = [point("a", 1, f"L{b}", v) for b, v in values.items()]
    s = scores(loaded, run(pts, plan=_blocks_plan({b: [f"L{b}"] for b in values}, 5)))["v"]
    assert (s.confidence, s.look, s.interval_label) == (pytest.approx(confidence), (blocks, 5), label)
    want = mean_interval([Obs(str(b), v, f"L{b}", b) for b, v in values.items()], look_critical(blocks, 5, 2))
    assert (s.ci_low, s.ci_high) == pytest.approx((want.ci_low, want.ci_high))


def test_a_fixed_design_says_95_percent_and_no_look(tmp_path: Path) -> None:
    loaded = study(tmp_path, hyp("v", TPUT, "{ arm = \"a\", concurrency = 1 }", ABOVE))
    pts = [point("a", 1, f"L{b}", 100.0 + b) for b in (1, 2, 3)]
    s = scores(loaded, run(pts, plan=_blocks_plan({b: [f"L{b}"] for b in (1, 2, 3)}, None)))["v"]
    assert (s.confidence, s.look, s.interval_label) == (0.95, None, "95% interval")
    assert interval_label(0.999, (10, 12)) == "99.9% interval, look 10 of 12"


# ---- the look from the pairs --------------------------------------------------------------------------


def test_a_paired_ratio_is_read_at_the_look_of_its_paired_blocks(tmp_path: Path) -> None:
    """Arm a in blocks 1-5, arm b in blocks 1-3 only (decided, not measured again): the ratio pairs blocks 3 of
    the run's 5 and is read at the look after block 3 (99.67%), not the run's last (96%)."""
    loaded = study(tmp_path, hyp("r", TPUT, "{ concurrency = 1 }", "{ ratio = [\"a\", \"b\"], range = [0.5, 2.0] }"))
    a = {b: 100.0 + b for b in (1, 2, 3, 4, 5)}
    bb = {1: 50.0, 2: 52.0, 3: 51.0}
    pts = [point("a", 1, f"a{b}", v) for b, v in a.items()] + [point("b", 1, f"b{b}", v) for b, v in bb.items()]
    plan = {"launches": [launch(f"La{b}", b, [(pid("a", 1, f"a{b}"), 1, "")]) for b in a]
            + [launch(f"Lb{b}", b, [(pid("b", 1, f"b{b}"), 1, "")]) for b in bb],
            "design": {"launches": {"a": 2, "b": 2}, "budget": {"blocks": 5}}}
    s = scores(loaded, run(pts, plan=plan))["r"]
    assert s.n == 3 and s.look == (3, 5) and s.interval_label == "99.67% interval, look 3 of 5"
    logs = [math.log(a[b] / bb[b]) for b in (1, 2, 3)]
    m = sum(logs) / 3
    sd = math.sqrt(sum((x - m) ** 2 for x in logs) / 2)
    half = t_quantile(1 - 0.01 / 3 / 2, 2) * sd / math.sqrt(3)
    assert (s.ci_low, s.ci_high) == pytest.approx((math.exp(m - half), math.exp(m + half)))
    assert s.has(Why.EARLY_LOOK) and s.has(Why.UNPAIRED)


def test_a_straddle_on_fewer_blocks_than_a_spent_budget_asks_for_a_new_run(tmp_path: Path) -> None:
    """Arm a in blocks 1-5, arm b in 1-4 of a run whose budget of 5 is spent: the ratio pairs 4 blocks and
    straddles 1x; the budget has no room (the run measured 5 blocks), so the note asks for a new run, not
    for "block 5 of the budget's 5". With a budget of 6 it has room: more blocks."""
    loaded = study(tmp_path, hyp("r", TPUT, "{ concurrency = 1 }", "{ ratio = [\"a\", \"b\"], range = [1.0, 2.0] }"))
    a = {b: 100.0 + 3 * (-1) ** b for b in (1, 2, 3, 4, 5)}
    bb = {1: 100.0, 2: 100.0, 3: 100.0, 4: 100.0}
    pts = [point("a", 1, f"a{b}", v) for b, v in a.items()] + [point("b", 1, f"b{b}", v) for b, v in bb.items()]

    def plan(budget: int) -> dict[str, Any]:
        return {"launches": [launch(f"La{b}", b, [(pid("a", 1, f"a{b}"), 1, "")]) for b in a]
                + [launch(f"Lb{b}", b, [(pid("b", 1, f"b{b}"), 1, "")]) for b in bb],
                "design": {"launches": {"a": 2, "b": 2}, "budget": {"blocks": budget}}}

    spent = scores(loaded, run(pts, plan=plan(5)))["r"]
    assert spent.verdict == "inconclusive" and spent.look == (4, 5)
    note = next(r for r in spent.reasons if r.why is Why.STRADDLES)
    assert note.decide.startswith("the budget is spent: a new run of"), note.decide
    room = scores(loaded, run(pts, plan=plan(6)))["r"]
    note = next(r for r in room.reasons if r.why is Why.STRADDLES)
    assert note.decide.startswith("more blocks"), note.decide


# ---- the sequential hook ------------------------------------------------------------------------------


def test_a_one_launch_hypothesis_stays_undecided_while_the_budget_has_blocks(tmp_path: Path) -> None:
    """Under a budget every block adds a launch of each arm its undecided hypotheses rest on, so a
    one-launch row asks for the next block; the budget bounds it, and a fixed design never asks."""
    loaded = study(tmp_path, hyp("v", TPUT, "{ arm = \"a\", concurrency = 1 }", ABOVE))
    one = [point("a", 1, "L1", 100.0)]
    assert undecided(loaded, run(one, plan=_blocks_plan({1: ["L1"]}, 3, first=1))) == ("v",)
    assert undecided(loaded, run(one, plan=_blocks_plan({1: ["L1"]}, None, first=1))) == ()
    three = [point("a", 1, f"L{b}", 100.0 + b) for b in (1, 2, 3)]
    spent = _blocks_plan({b: [f"L{b}"] for b in (1, 2, 3)}, 3)
    assert undecided(loaded, run(three[:1], plan=spent)) == ("v",)
    assert undecided(loaded, run(three, plan=spent)) == ()  # spent: nothing more, decided or not


# ---- what would decide it -----------------------------------------------------------------------------


def test_gap_and_unit_spread() -> None:
    assert gap(1.0, [math.e]) == pytest.approx(1.0) and gap(2.0, [1.0, 4.0]) == pytest.approx(math.log(2))
    assert gap(-1.0, [2.0, 0.0]) == pytest.approx(1.5) and gap(1.0, [0.0]) is None
    pairs = ratio_interval([Obs(f"t{b}", 2.0 * (1 + 0.01 * b), f"T{b}", b) for b in (1, 2, 3)],
                           [Obs(f"b{b}", 1.0, f"B{b}", b) for b in (1, 2, 3)])
    logs = [math.log(2.0 * (1 + 0.01 * b)) for b in (1, 2, 3)]
    m = sum(logs) / 3
    assert unit_spread(pairs, fixed_critical) == pytest.approx(math.sqrt(sum((x - m) ** 2 for x in logs) / 2))
    assert unit_spread(mean_interval([Obs("a", 5.0, "L", 1)]), fixed_critical) is None


def test_straddling_says_blocks_while_the_budget_has_room_else_a_new_run_or_launches() -> None:
    est = mean_interval([Obs(f"L{b}", v, f"L{b}", b) for b, v in ((1, 100.0), (2, 104.0), (3, 98.0))],
                        look_critical(3, 12, 3))
    spread = unit_spread(est, look_critical(3, 12, 3))
    assert spread is not None
    distance = math.log(est.mean / 95.0)
    n = blocks_within(distance, spread, first=3, budget=12)
    assert n is not None and n > 3
    assert straddling(est, look_critical(3, 12, 3), [95.0], 12, 3, 3) == (
        f"more blocks: at this spread, about block {n} of the budget's 12")
    spent = blocks_to_clear(distance, spread, first=3)
    assert straddling(est, look_critical(3, 12, 3), [95.0], 3, 3, 3) == (
        f"the budget is spent: a new run of about {spent} blocks at this spread")
    fixed = mean_interval([Obs(f"L{b}", v, f"L{b}", b) for b, v in ((1, 100.0), (2, 104.0), (3, 98.0))])
    launches = blocks_to_clear(distance, unit_spread(fixed, fixed_critical) or 0.0, first=100)
    assert straddling(fixed, fixed_critical, [95.0], None, 1, 3) == f"about {launches} launches per arm at this spread"
    on_edge = straddling(fixed, fixed_critical, [fixed.mean], None, 1, 3)
    assert on_edge == "more launches per arm"  # no distance to clear: no number
    assert straddling(est, look_critical(3, 12, 3), [est.mean], 12, 3, 3) == "more blocks (the budget has room)"


def test_one_launch_asks_for_launches_from_the_repeats_spread() -> None:
    est = mean_interval([Obs(f"r{r}", v, "L", 1, r) for r, v in ((1, 100.0), (2, 101.0), (3, 99.0))])
    assert est.one_launch
    n = blocks_to_clear(math.log(est.mean / 95.0), unit_spread(est, fixed_critical) or 0.0, first=100)
    assert one_launch(est, fixed_critical, [95.0, 105.0], None) == (
        f"at least {n} launches per arm (from its repeats' spread; launches vary at least as much)")
    assert "(blocks of the budget)" in one_launch(est, fixed_critical, [95.0, 105.0], 4)
    assert one_launch(est, fixed_critical, [est.mean], None).startswith("more than 100 launches per arm")

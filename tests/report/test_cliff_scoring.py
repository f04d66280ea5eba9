"""A hypothesis on a tail percentile that sits on a cliff on some of its points (runner.checks.tails) is
inconclusive, said as such, whatever its interval would read; the same points scored on another metric, or
with the check passed or unverified, keep the interval's verdict. The runner's stopping rule does not spend
blocks on it."""

from __future__ import annotations

from pathlib import Path

from report.score_model import Reason, Why, label_of
from report.scoring import NOT_LAUNCHES, OFF_THE_CLIFF, undecided
from runner.store.records import CheckResult
from tests.report.test_scoring_branches import hyp, launch, pid, point, run, scores, study

ITL = "itl_p95_s"


def two_launches(metric: str, values: tuple[float, float]) -> tuple[list, dict]:
    pts = [point("a", 1, lid, v, metric=metric) for lid, v in zip(("L1", "L2"), values, strict=True)]
    plan = {"launches": [launch(lid, b, [(pid("a", 1, lid), 1, "")]) for lid, b in (("L1", 1), ("L2", 2))]}
    return pts, plan


def stable(point_id: str, metric: str, status: str) -> CheckResult:
    name = metric.removesuffix("_s") + "_stable"
    return CheckResult(point_id, name, status == "pass", "warn", 3.0 if status == "fail" else None, 2.0, "d",
                       status)  # type: ignore[arg-type]


def test_a_cliff_makes_a_decided_tail_inconclusive(tmp_path: Path) -> None:
    """Failing case: two launches well inside the relation (confirmed by their interval), one of them on a
    cliff: inconclusive (on a cliff), with the point named and no flag for it."""
    loaded = study(tmp_path, hyp("tail", ITL, "{ arm = \"a\", concurrency = 1 }", "{ relation = \"<\", value = 1.0 }"))
    pts, plan = two_launches(ITL, (0.0100, 0.0101))
    clean = scores(loaded, run(pts, plan=plan))["tail"]
    assert clean.verdict == "confirmed" and not clean.has(Why.ON_A_CLIFF)
    s = scores(loaded, run(pts, plan=plan, checks=[stable(pid("a", 1, "L2"), ITL, "fail")]))["tail"]
    assert (s.verdict, s.verdict_spec) == ("inconclusive", "inconclusive")
    assert (s.verdict_label, s.verdict_spec_label) == ("inconclusive (on a cliff)",) * 2
    cliff = Reason(Why.ON_A_CLIFF, count=1, detail=pid("a", 1, "L2"), label="p95", decide=OFF_THE_CLIFF)
    assert s.reasons == (Reason(Why.NOT_CALIBRATED), cliff)
    assert s.checks == ("itl_p95_stable",) and s.flags == ()
    assert s.notes[-1] == (f"inconclusive (on a cliff): its p95 sits between two modes on 1 point(s) "
                           f"({pid('a', 1, 'L2')}): it reads whether the share of slow ones is over or under the "
                           f"tail's share, not how slow they are; what would decide it: not more launches, "
                           f"{OFF_THE_CLIFF}")
    assert s.measured == clean.measured and s.ci_low == clean.ci_low  # the number stands


def test_a_cliff_replaces_what_launches_would_decide(tmp_path: Path) -> None:
    """A straddling interval on a cliff loses its 'more launches' reason; a one-launch row keeps saying it
    rests on one launch, but not that launches would decide it."""
    loaded = study(tmp_path, hyp("tail", ITL, "{ arm = \"a\", concurrency = 1 }",
                                 "{ relation = \"<\", value = 0.0101 }"))
    pts, plan = two_launches(ITL, (0.0100, 0.0102))
    straddling = scores(loaded, run(pts, plan=plan))["tail"]
    assert straddling.verdict == "inconclusive" and straddling.has(Why.STRADDLES)
    both = [stable(pid("a", 1, lid), ITL, "fail") for lid in ("L1", "L2")]
    s = scores(loaded, run(pts, plan=plan, checks=both))["tail"]
    assert not s.has(Why.STRADDLES) and s.verdict == "inconclusive"
    assert s.reasons[-1] == Reason(Why.ON_A_CLIFF, count=2, detail=f"{pid('a', 1, 'L1')}, {pid('a', 1, 'L2')}",
                                   label="p95", decide=OFF_THE_CLIFF)
    one = [point("a", 1, "r1", 0.0100, metric=ITL)]
    alone = scores(loaded, run(one, checks=[stable(pid("a", 1, "r1"), ITL, "fail")]))["tail"]
    kinds = [r.why for r in alone.reasons]
    assert kinds == [Why.NOT_CALIBRATED, Why.ONE_LAUNCH, Why.ON_A_CLIFF]
    assert alone.reasons[1].decide == NOT_LAUNCHES and alone.verdict_label == "inconclusive (on a cliff)"


def test_another_metric_and_other_statuses_keep_the_verdict(tmp_path: Path) -> None:
    """Clean cases: a throughput hypothesis on points whose ITL p95 is on a cliff is neither touched nor flagged
    by it; an ITL p99 hypothesis is not touched by the p95's cliff; an unverified stability check flags the
    point (it could not tell) without deciding the verdict."""
    tput = study(tmp_path, hyp("t", "output_throughput", "{ arm = \"a\", concurrency = 1 }",
                               "{ relation = \">\", value = 1.0 }"))
    pts, plan = two_launches("output_throughput", (100.0, 101.0))
    s = scores(tput, run(pts, plan=plan, checks=[stable(pid("a", 1, "L1"), ITL, "fail")]))["t"]
    assert s.verdict == "confirmed" and s.flags == () and s.checks == () and not s.has(Why.ON_A_CLIFF)
    p99 = study(tmp_path, hyp("p99", "itl_p99_s", "{ arm = \"a\", concurrency = 1 }",
                              "{ relation = \"<\", value = 1.0 }"))
    pts, plan = two_launches("itl_p99_s", (0.02, 0.021))
    s = scores(p99, run(pts, plan=plan, checks=[stable(pid("a", 1, "L1"), ITL, "fail")]))["p99"]
    assert s.verdict == "confirmed" and s.flags == ()
    s = scores(p99, run(pts, plan=plan, checks=[stable(pid("a", 1, "L1"), "itl_p99_s", "unverified")]))["p99"]
    assert s.verdict == "confirmed" and s.flags == (f"warning itl_p99_stable on {pid('a', 1, 'L1')}",)


def test_an_invalid_row_stays_invalid_on_a_cliff(tmp_path: Path) -> None:
    """Invalid by a failed check, or by a prediction that no longer evaluates: a cliff does not make either
    inconclusive (which would keep a budget adding blocks)."""
    loaded = study(tmp_path, hyp("tail", ITL, "{ arm = \"a\", concurrency = 1 }", "{ relation = \"<\", value = 1.0 }"))
    pts, plan = two_launches(ITL, (0.0100, 0.0101))
    checks = [stable(pid("a", 1, "L1"), ITL, "fail"),
              CheckResult(pid("a", 1, "L2"), "errors", False, "fail", 1.0, 0.0, "d", "fail")]
    s = scores(loaded, run(pts, plan=plan, checks=checks))["tail"]
    assert s.verdict == "invalid" and not s.has(Why.ON_A_CLIFF)
    broken = study(tmp_path, hyp("tail", ITL, "{ arm = \"a\", concurrency = 1 }",
                                 "{ relation = \"<\", value = \"model.params / 1e3\" }"))
    (tmp_path / "m" / "base" / "config.json").write_text("{ not json")
    s = scores(broken, run(pts, plan=plan, checks=checks[:1]))["tail"]
    assert (s.verdict, s.verdict_spec) == ("invalid", "invalid") and not s.has(Why.ON_A_CLIFF)


def test_label_of_orders_the_causes() -> None:
    assert label_of("inconclusive", True, False, True) == "inconclusive (on a cliff)"
    assert label_of("inconclusive", True, False, False) == "inconclusive (one launch)"
    assert label_of("inconclusive", False, False, False) == "inconclusive"
    assert label_of("confirmed", True, False, True) == "confirmed"
    assert label_of("invalid", False, True, True) == "not measurable here"


def test_the_stopping_rule_spends_no_block_on_a_cliff(tmp_path: Path) -> None:
    """A one-launch row under a budget asks for the next block; on a cliff it does not (no block decides it)."""
    loaded = study(tmp_path, hyp("tail", ITL, "{ arm = \"a\", concurrency = 1 }", "{ relation = \"<\", value = 1.0 }"))
    one = [point("a", 1, "L1", 0.01, metric=ITL)]
    plan = {"launches": [launch("L1", 1, [(pid("a", 1, "L1"), 1, "")])],
            "design": {"launches": {"a": 1}, "budget": {"blocks": 3}}}
    assert undecided(loaded, run(one, plan=plan)) == ("tail",)
    assert undecided(loaded, run(one, plan=plan, checks=[stable(pid("a", 1, "L1"), ITL, "fail")])) == ()
    near = study(tmp_path, hyp("near", ITL, "{ arm = \"a\", concurrency = 1 }",
                               "{ relation = \"<\", value = 0.0101 }"))
    pts, two = two_launches(ITL, (0.0100, 0.0102))  # straddles 0.0101: inconclusive
    room = {**two, "design": {"launches": {"a": 1}, "budget": {"blocks": 3}}}
    spent = {**two, "design": {"launches": {"a": 1}, "budget": {"blocks": 2}}}
    assert undecided(near, run(pts, plan=room)) == ("near",)
    assert undecided(near, run(pts, plan=spent)) == ()  # both budget blocks measured: nothing more

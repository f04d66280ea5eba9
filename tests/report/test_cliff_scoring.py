"""A hypothesis on a tail percentile that sits on a cliff on some of its points (runner.checks.tails) is read
as the launches' mean percentile with its between-launch interval, the cliff points named in a note (not a
lock: docs/verdicts.md, "Tail percentiles"); the same points scored on another metric, or with the check
passed or unverified, are not touched. The runner's stopping rule treats it as any undecided row."""

from __future__ import annotations

from pathlib import Path

from report.scoring.score_model import Reason, Why, label_of
from report.scoring.scoring import undecided
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


def test_a_cliff_is_named_not_a_lock(tmp_path: Path) -> None:
    """Two launches well inside the relation, one of them on a cliff: the verdict is the launches' mean p95 and
    its between-launch interval (confirmed, as without the cliff), with the cliff point named in a note and no
    flag for it. Before, a cliff locked the row as inconclusive whatever its interval read."""
    loaded = study(tmp_path, hyp("tail", ITL, "{ arm = \"a\", concurrency = 1 }", "{ relation = \"<\", value = 1.0 }"))
    pts, plan = two_launches(ITL, (0.0100, 0.0101))
    clean = scores(loaded, run(pts, plan=plan))["tail"]
    assert clean.verdict == "confirmed" and not clean.has(Why.ON_A_CLIFF)
    s = scores(loaded, run(pts, plan=plan, checks=[stable(pid("a", 1, "L2"), ITL, "fail")]))["tail"]
    assert (s.verdict, s.verdict_spec, s.verdict_label) == ("confirmed", "confirmed", "confirmed")
    cliff = Reason(Why.ON_A_CLIFF, count=1, detail=pid("a", 1, "L2"), label="p95")
    assert s.reasons == (Reason(Why.NOT_CALIBRATED), cliff)
    assert s.checks == ("itl_p95_stable",) and s.flags == ()
    assert s.notes[-1] == (f"on a cliff: its p95 sits between two modes on 1 point(s) ({pid('a', 1, 'L2')}): there "
                           "a launch's p95 reads whether its share of slow ones is over or under the tail's share, "
                           "so launches differ by a mode; the verdict reads the launches' mean p95 and its "
                           "between-launch interval, which holds that spread")
    assert (s.measured, s.ci_low, s.ci_high) == (clean.measured, clean.ci_low, clean.ci_high)


def test_a_straddling_cliff_keeps_what_launches_would_decide(tmp_path: Path) -> None:
    """A straddling interval on a cliff is inconclusive by its interval and keeps its 'more launches' reason
    (launches that land in either mode are what the between-launch interval averages); a one-launch row keeps
    saying it rests on one launch."""
    loaded = study(tmp_path, hyp("tail", ITL, "{ arm = \"a\", concurrency = 1 }",
                                 "{ relation = \"<\", value = 0.0101 }"))
    pts, plan = two_launches(ITL, (0.0100, 0.0102))
    straddling = scores(loaded, run(pts, plan=plan))["tail"]
    assert straddling.verdict == "inconclusive" and straddling.has(Why.STRADDLES)
    both = [stable(pid("a", 1, lid), ITL, "fail") for lid in ("L1", "L2")]
    s = scores(loaded, run(pts, plan=plan, checks=both))["tail"]
    assert s.has(Why.STRADDLES) and s.verdict == "inconclusive" and s.verdict_label == "inconclusive"
    assert s.reasons[-1] == Reason(Why.ON_A_CLIFF, count=2, detail=f"{pid('a', 1, 'L1')}, {pid('a', 1, 'L2')}",
                                   label="p95")
    one = [point("a", 1, "r1", 0.0100, metric=ITL)]
    alone = scores(loaded, run(one, checks=[stable(pid("a", 1, "r1"), ITL, "fail")]))["tail"]
    assert [r.why for r in alone.reasons] == [Why.NOT_CALIBRATED, Why.ONE_LAUNCH, Why.ON_A_CLIFF]
    assert alone.verdict_label == "inconclusive (one launch)"


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
    assert label_of("inconclusive", True, False) == "inconclusive (one launch)"
    assert label_of("inconclusive", False, False) == "inconclusive"
    assert label_of("confirmed", True, False) == "confirmed"
    assert label_of("invalid", False, True) == "not measurable here"


def test_the_stopping_rule_spends_blocks_on_a_cliff_as_on_any_undecided_row(tmp_path: Path) -> None:
    """A one-launch row under a budget asks for the next block, on a cliff or not: the between-launch interval
    is what more blocks narrow."""
    loaded = study(tmp_path, hyp("tail", ITL, "{ arm = \"a\", concurrency = 1 }", "{ relation = \"<\", value = 1.0 }"))
    one = [point("a", 1, "L1", 0.01, metric=ITL)]
    plan = {"launches": [launch("L1", 1, [(pid("a", 1, "L1"), 1, "")])],
            "design": {"launches": {"a": 1}, "budget": {"blocks": 3}}}
    assert undecided(loaded, run(one, plan=plan)) == ("tail",)
    assert undecided(loaded, run(one, plan=plan, checks=[stable(pid("a", 1, "L1"), ITL, "fail")])) == ("tail",)
    near = study(tmp_path, hyp("near", ITL, "{ arm = \"a\", concurrency = 1 }",
                               "{ relation = \"<\", value = 0.0101 }"))
    pts, two = two_launches(ITL, (0.0100, 0.0102))  # straddles 0.0101: inconclusive
    room = {**two, "design": {"launches": {"a": 1}, "budget": {"blocks": 3}}}
    spent = {**two, "design": {"launches": {"a": 1}, "budget": {"blocks": 2}}}
    assert undecided(near, run(pts, plan=room)) == ("near",)
    assert undecided(near, run(pts, plan=spent)) == ()  # both budget blocks measured: nothing more

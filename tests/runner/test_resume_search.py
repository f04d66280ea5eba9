"""`--resume` and capacity searches: a search cut short (its next probe not stored) is set aside and run again
whole on the resumed start; one that ended (resolved, or stopped by an invalid probe) is kept as it is."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from compiler.capacity import probe_point
from compiler.load import load_study
from compiler.plan import Plan, SearchStep
from compiler.plan_compile import compile_study
from runner.execute.resume import rerun_cut_searches
from runner.store.records import CheckResult, PointRecord, PointSummary, RunRecord
from runner.store.store import Store
from tests.compiler.test_slo import _variant


def _plan(tmp: Path) -> Plan:
    return compile_study(load_study(_variant(tmp, ("launches = 1", "launches = 2"))))


def _store(tmp: Path, plan: Plan, probes: dict[str, list[tuple[int, float, bool]]]) -> Path:
    """A run with, per search id, its probes as (level, SLO attainment, valid), in the search's order."""
    db = tmp / "runs.duckdb"
    searches = {q.id: q for launch in plan.launches for q in launch.searches}
    with Store(db) as store:
        store.save_run(RunRecord("r1", plan.study_id, plan_json=plan.to_json(), started_at=datetime(2026, 1, 1)))
        for sid, rows in probes.items():
            for level, attainment, valid in rows:
                step = probe_point(searches[sid], float(level))
                store.commit_point(
                    PointRecord("r1", step.id, arm=step.arm, concurrency=level, fingerprint=step.fingerprint,
                                valid=valid, summary=PointSummary(requests_ok=16, slo_attainment=attainment)),
                    [], [CheckResult(step.id, "errors", valid, "fail", 0.0, 0.0, "")], [])
    return db


def _search(plan: Plan, arm: str, launch: int) -> SearchStep:
    return next(q for lc in plan.launches for q in lc.searches if q.id.startswith(f"capacity/{arm}/L{launch}/"))


def test_a_search_cut_short_is_set_aside_and_one_that_ended_is_kept(tmp_path: Path) -> None:
    plan = _plan(tmp_path)
    cut, ended, stopped = _search(plan, "large", 1), _search(plan, "large", 2), _search(plan, "small", 1)
    target = cut.attainment
    lo, hi = int(cut.lo), int(cut.hi)
    db = _store(tmp_path, plan, {
        cut.id: [(hi, target - 0.01, True), (lo, target, True)],  # bracketed at [lo, hi): a third probe is due
        ended.id: [(hi, target, True)],  # the top holds: above the range, over
        stopped.id: [(hi, 0.5, True), (lo, 1.0, False)],  # an invalid probe stops it: over (unresolved)
    })
    with Store(db) as store:
        done = store.done_points("r1")
        kept, messages = rerun_cut_searches(store, "r1", plan, dict(done))
        assert len(messages) == 1 and f"capacity search {cut.id} cut short after 2 probe(s)" in messages[0]
        assert not any(pid.startswith(cut.id + "/") for pid in kept)  # run again whole
        assert any(pid.startswith(ended.id + "/") for pid in kept)
        assert [p for p in done if p.startswith(stopped.id + "/")] == [p for p in kept if p.startswith(stopped.id)]
        rows = {p.point_id: p for p in store.points("r1")}
        aside = [p for pid, p in rows.items() if pid.startswith(cut.id + "/")]
        assert len(aside) == 2 and all(p.point_id.endswith("#aside1") and "cut short" in (p.set_aside or "")
                                       for p in aside)
        assert store.done_points("r1").keys() == kept.keys()


def test_a_search_with_no_stored_probe_is_left_to_run(tmp_path: Path) -> None:
    plan = _plan(tmp_path)
    db = _store(tmp_path, plan, {})
    with Store(db) as store:
        kept, messages = rerun_cut_searches(store, "r1", plan, {})
        assert kept == {} and messages == []

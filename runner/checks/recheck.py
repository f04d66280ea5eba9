"""Re-judge every point from its stored request records, with today's checks.

Results are the truth: when a check's definition is corrected, old runs are re-judged from their
own records, never re-measured. What the server said (the edge counters, prefix-cache counters, GPU
telemetry) is kept as stored; a point stored without edge counters (schema < 3) cannot be
reconciled, so its reconciliation is `unverified` and the point is not valid. A point run on several
replicas gets its per-replica reconciliation again from the deltas stored in `replicas_json`; a point
measured beside a held server keeps its stored `held_start_paused` (read while it ran, not from records).
Opening the database for writing also migrates an older schema.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path

from base import __version__
from base.errors import EngineError
from compiler.capacity import probe_of
from compiler.plan import Plan, PointStep
from runner.checks.checks import Expectation
from runner.checks.expect import point_expectation
from runner.checks.judge import ServerSide, judge
from runner.execute import replicas
from runner.execute.prestart import CHECK as HELD_CHECK
from runner.load.trace_file import trace_rows
from runner.store.records import CheckResult
from runner.store.store import Store


@dataclass
class RecheckReport:
    points: int = 0
    changed: int = 0
    details: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)  # points whose stored judgement stands, and why


def _expected(step: PointStep) -> Expectation | str:
    """The point's expected lengths and hits, from its seeded requests; why not, when a replayed trace can no
    longer be read as the plan had it (its requests cannot be known again, so its stored judgement stands)."""
    try:
        return point_expectation(step, trace_rows(step))
    except EngineError as exc:
        return str(exc)


def recheck(db: Path) -> RecheckReport:
    report = RecheckReport()
    with Store(db) as store:
        for run in store.runs():
            plan = Plan.from_stored(run.plan_json)
            if plan is None:
                continue
            steps = {p.id: p for p in plan.points}
            caching = {launch.arm: launch.engine.prefix_caching for launch in plan.launches}  # an arm's argv
            searches = [q for launch in plan.launches for q in launch.searches]
            stored: dict[str, set[tuple[str, str]]] = {}
            held: dict[str, list[CheckResult]] = {}
            for check in store.checks(run.run_id):
                stored.setdefault(check.point_id, set()).add((check.name, str(check.status)))
                if check.name == HELD_CHECK:
                    held.setdefault(check.point_id, []).append(check)
            for point in store.points(run.run_id):
                step = steps.get(point.point_id) or probe_of(searches, point)
                if step is None or point.status != "ok":
                    continue
                expected = _expected(step)
                if isinstance(expected, str):
                    report.kept.append(f"{run.run_id} {point.point_id}: not rechecked, stored checks kept: {expected}")
                    continue
                records = store.request_records(run.run_id, point.point_id)
                judged = judge(step, records, ServerSide.stored(point), thresholds=plan.checks,
                               client_ceiling_chunks_per_s=run.client_ceiling_chunks_per_s,
                               client_stall_s=point.summary.client_stall_max_s, expected=expected,
                               slo=plan.slo, prefix_caching=caching.get(step.arm, True))
                if point.replicas_json:  # run on replicas: judge each one's counters again
                    rows = json.loads(point.replicas_json)
                    judged = replicas.with_check(judged, replicas.replica_check(point.point_id, rows))
                for kept in held.get(point.point_id, ()):  # measured while the point ran: kept as stored
                    judged = replicas.with_check(judged, kept)
                old = stored.get(point.point_id, set())
                new = {(c.name, str(c.status)) for c in judged.checks}
                report.points += 1
                if old != new:
                    report.changed += 1
                    report.details.append(f"{run.run_id} {point.point_id}: {sorted(old - new)} -> {sorted(new - old)}")
                store.replace_judgement(
                    replace(point, summary=judged.summary, valid=judged.valid, flagged=judged.flagged,
                            verdict=judged.reason),
                    judged.checks,
                )
            note = f"checks recomputed from stored records by studyc {__version__}"
            if note not in (run.notes or ""):
                store.save_run(replace(run, notes=((run.notes or "") + "; " + note).strip("; ")))
    return report

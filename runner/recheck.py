"""Recompute every point's statistics and checks from the stored request records.

Results are the truth: when a check's definition is corrected, old runs are re-judged from their
own records, never re-measured. Metrics read from the server (hit rate, KV usage) are kept.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from compiler.plan import Plan
from runner import checks as checks_mod
from runner.loadgen import RequestRecord
from runner.store import Store
from runner.summary import halves_gap, summarize
from studyc import __version__


@dataclass
class RecheckReport:
    points: int = 0
    changed: int = 0
    details: list[str] | None = None


def recheck(db: Path) -> RecheckReport:
    details: list[str] = []
    report = RecheckReport(details=details)
    with Store(db) as store:
        for run in store.runs():
            plan = Plan.model_validate_json(run["plan_json"])
            steps = {p.id: p for p in plan.points}
            ceiling = run.get("client_ceiling_chunks_per_s")
            stored: dict[str, set[tuple[str, bool]]] = {}
            for check in store.checks(run["run_id"]):
                stored.setdefault(check["point_id"], set()).add((check["name"], check["passed"]))
            for row in store.point_rows(run["run_id"]):
                step = steps.get(row.point_id)
                if step is None or row.status != "ok":
                    continue
                records = [
                    RequestRecord(
                        index=r["idx"], warmup=bool(r["warmup"]), scheduled_s=r["scheduled_s"],
                        sent_s=r["sent_s"], first_token_s=r["first_token_s"], end_s=r["end_s"],
                        token_times_s=tuple(r["token_times_s"] or ()), prompt_tokens=r["prompt_tokens"] or 0,
                        output_tokens=r["output_tokens"] or 0, chunks=r["chunks"] or 0, ok=bool(r["ok"]),
                        error=r["error"], status=r["status"],
                    )
                    for r in store.request_records(run["run_id"], row.point_id)
                ]
                measured = [r for r in records if not r.warmup]
                summary = summarize(measured, step.concurrency)
                found = checks_mod.evaluate(
                    step, summary, thresholds=plan.checks, reset_ok=row.values.get("reset_ok"),
                    hit_rate=row.values.get("prefix_hit_rate"),
                    output_lengths=[r.output_tokens for r in measured if r.ok],
                    halves_gap=halves_gap(measured), client_ceiling_chunks_per_s=ceiling,
                )
                valid, flagged = checks_mod.verdict(found)
                old = stored.get(row.point_id, set())
                new = {(c.name, c.passed) for c in found}
                report.points += 1
                if old != new:
                    report.changed += 1
                    details.append(f"{row.point_id}: {sorted(old - new)} -> {sorted(new - old)}")
                values = {k: v for k, v in summary.items() if k in row.values} | {"valid": valid, "flagged": flagged}
                rows = [{"run_id": run["run_id"], "point_id": row.point_id, **c.row()} for c in found]
                store.replace_checks(run["run_id"], row.point_id, values, rows)
            note = f"checks recomputed from stored records by studyc {__version__}"
            if note not in (run.get("notes") or ""):
                store.update_run(run["run_id"], notes=((run.get("notes") or "") + "; " + note).strip("; "))
    return report




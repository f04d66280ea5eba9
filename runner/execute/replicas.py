"""Replicas of one launch: the servers behind the client's balancer, seen as one arm and one by one.

The arm as a whole: the replicas' scrapes are merged into one Snapshot (every sample kept, labelled
`studyc_replica`; sums add up), so the judge's reconciliation compares the sum of the replicas'
counter deltas with all the arm's requests. Per replica: each server's deltas against the requests
the balancer sent it (`replica_check`), and what each received is stored (`replicas_json`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from types import MappingProxyType

from runner.checks import checks as checks_mod
from runner.checks.judge import Judgement
from runner.checks.reconcile import COMPLETED_REASONS, finished_by_reason
from runner.measure import prometheus
from runner.measure.prometheus import Sample, Snapshot
from runner.store.records import CheckResult, RequestRecord

REPLICA_LABEL = "studyc_replica"
EXACT_ITEMS = ("requests", "prompt_tokens", "generation_tokens")


def merge(parts: Sequence[Snapshot], *, edge: str) -> Snapshot:
    """One Snapshot of several servers. `edge` is "before" (time = the latest scrape: every measured
    request was sent after it) or "after" (time = the earliest: every one had ended before it)."""
    if len(parts) == 1:
        return parts[0]
    samples: list[Sample] = []
    sums: dict[str, float] = {}
    types: dict[str, str] = {}
    for k, snap in enumerate(parts):
        types.update(snap.types)
        for s in snap.samples:
            samples.append(Sample(s.name, MappingProxyType({**s.labels, REPLICA_LABEL: str(k)}), s.value))
        for name, value in snap.sums.items():
            sums[name] = sums.get(name, 0.0) + value
    t = max(p.t_s for p in parts) if edge == "before" else min(p.t_s for p in parts)
    return Snapshot(t_s=t, samples=tuple(samples), types=MappingProxyType(types), sums=MappingProxyType(sums))


def scrape_all(urls: Sequence[str], api_key: str | None) -> tuple[Snapshot, ...]:
    return tuple(prometheus.scrape(u, api_key) for u in urls)


def _delta(before: Snapshot, after: Snapshot, name: str) -> float | None:
    return prometheus.delta(before, after, name)


def replica_rows(
    server_ids: Sequence[str], before: Sequence[Snapshot], after: Sequence[Snapshot],
    records: Sequence[RequestRecord], replica_of: Sequence[int],
) -> list[dict[str, object]]:
    """Per replica: the measured requests the client sent it (and their tokens) beside the server's
    own counter deltas over the window."""
    rows = []
    for k, sid in enumerate(server_ids):
        mine = [r for r, i in zip(records, replica_of, strict=True) if i == k and not r.warmup]
        done = [r for r in mine if r.ok]
        reasons = finished_by_reason(before[k], after[k])
        completed = None if reasons is None else sum(reasons.get(x, 0.0) for x in COMPLETED_REASONS)
        rows.append({
            "server_id": sid,
            "client": {"requests": len(done), "sent": len(mine),
                       "prompt_tokens": sum(r.prompt_tokens for r in done),
                       "generation_tokens": sum(r.output_tokens for r in done)},
            "server": {"requests": completed,
                       "prompt_tokens": _delta(before[k], after[k], prometheus.PROMPT_TOKENS),
                       "generation_tokens": _delta(before[k], after[k], prometheus.GENERATION_TOKENS)},
            "failed": len(mine) - len(done),
        })
    return rows


def replica_check(point_id: str, rows: Sequence[dict]) -> CheckResult:
    """Every replica's completed requests, prompt and generation tokens equal its own counters'
    deltas (exact). Fails on any difference; unverified where a replica had failed requests or a
    counter is missing, or when there are no rows at all."""
    if not rows:
        return CheckResult(point_id, "replica_reconciliation", False, "fail", None, 0.0,
                           "no replica counters recorded", status="unverified")
    bad, unknown = [], []
    for row in rows:
        if row["failed"]:
            unknown.append(f"{row['server_id']}: {row['failed']} failed requests")
            continue
        for item in EXACT_ITEMS:
            c, s = row["client"][item], row["server"][item]
            if s is None:
                unknown.append(f"{row['server_id']}: no {item} counter")
            elif float(s) != float(c):
                bad.append(f"{row['server_id']} {item}: server {s:g}, client {c:g}")
    sent = ", ".join(f"{r['server_id']}: {r['client']['sent']}" for r in rows)
    if bad:
        return CheckResult(point_id, "replica_reconciliation", False, "fail", float(len(bad)), 0.0,
                           "; ".join(bad) + f" (requests sent {sent})", status="fail")
    if unknown:
        return CheckResult(point_id, "replica_reconciliation", False, "fail", None, 0.0,
                           "; ".join(unknown), status="unverified")
    return CheckResult(point_id, "replica_reconciliation", True, "fail", 0.0, 0.0,
                       f"each replica's counters agree with the requests sent it ({sent})", status="pass")


def replicas_json(rows: Sequence[dict]) -> str:
    return json.dumps(list(rows), separators=(",", ":"))


def with_check(judgement: Judgement, check: CheckResult) -> Judgement:
    """The judgement with one more check, its verdict recomputed."""
    found = (*judgement.checks, check)
    valid, flagged = checks_mod.verdict(found)
    return replace(judgement, checks=found, valid=valid, flagged=flagged, reason=checks_mod.verdict_reason(found))

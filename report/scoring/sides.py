"""The measured sides of a hypothesis: exactly the plan's point ids (server ids for a server metric) read
from a run, with their observations, failed checks, flags, what makes them invalid, and which of them
lack the metric and why (never dropped silently).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from compiler.metrics import MACHINE_METRICS
from report.results import RunData
from report.scoring.score_model import SPLIT, Reason, Why
from report.stats.intervals import Layout, Obs
from runner.checks.fidelity import WITHHELD_METRICS
from runner.checks.tails import TAILS, check_name
from runner.store.records import CheckResult, PointRecord, ServerRecord, base_server_id

WITHHELD = "withheld: the client's token gaps came bunched (itl_trusted failed), so its ITL percentiles would describe the client"
NOT_FINITE = "not a finite number"
NOT_RECORDED = "not recorded on the point (no completed request, or no GPU telemetry for a GPU metric)"
SERVER_NOT_RECORDED = "not reported by the server"
NOT_CALIBRATED = ("not calibrated: its launch stored no calibration (a run from before machine metrics, or "
                  "a plan that did not ask for them)")


@dataclass
class MeasuredSide:
    """One side of a hypothesis (the numerator, or the denominator of a ratio) as measured."""

    values: list[Obs] = field(default_factory=list)  # with their launch, block and exchangeability
    ceilings: list[Obs] = field(default_factory=list)  # a capacity's lowest level that failed, per launch
    rows: int = 0
    point_ids: list[str] = field(default_factory=list)
    invalid: list[Reason] = field(default_factory=list)
    checks: set[str] = field(default_factory=set)
    flags: dict[str, list[str]] = field(default_factory=dict)  # what is flagged -> point ids
    lacking: dict[str, list[str]] = field(default_factory=dict)  # why the metric is missing -> point ids
    cliffs: list[str] = field(default_factory=list)  # points whose value of the metric is on a cliff

    def missing(self, metric: str) -> list[Reason]:
        """One reason per cause: how many of the side's points lack the metric, which, and why."""
        return [Reason(Why.MISSING_VALUES, count=len(ids), detail=f"{metric} {why} ({', '.join(ids)})")
                for why, ids in sorted(self.lacking.items())]


def split_blocks(data: RunData, design: Layout) -> dict[int, str]:
    """Block -> why it is left out of every interval: its points ran on more than one host (`RunData.hosts`),
    so its arms' ratio holds the hosts' difference too. A `--resume` since schema 6 runs such a block again
    whole; one found in an older run is left out here. None are left out of a layout read as the stopping rule
    read it during the run (`Layout.during_run`)."""
    if design.during_run:
        return {}
    hosts: dict[int, set[str]] = {}
    for p in data.points:
        block = design.point(p.point_id, p.server_id, p.repeat).block
        if block is not None and p.status == "ok":
            hosts.setdefault(block, set()).add(data.hosts.get(p.server_id or "", "host not recorded"))
    return {b: f"{SPLIT} {b} ran on {len(h)} hosts: {'; '.join(sorted(h))}" for b, h in hosts.items() if len(h) > 1}


def point_side(data: RunData, ids: Sequence[str], metric: str, failed_checks: dict[str, list[CheckResult]],
               design: Layout) -> MeasuredSide:
    """The stored points of one side of a hypothesis: exactly the plan's point ids; those of a block split
    across hosts are not exchangeable (left out of the interval, with the reason)."""
    side = MeasuredSide()
    split = split_blocks(data, design)
    wanted = set(ids)
    rows: list[PointRecord] = [p for p in data.points if p.point_id in wanted]
    for row in sorted(rows, key=lambda r: (r.repeat, r.point_id)):
        side.rows += 1
        side.point_ids.append(row.point_id)
        fails = failed_checks.get(row.point_id, [])
        fail_names = sorted({c.name for c in fails if c.severity == "fail"})
        warn_names = sorted({c.name for c in fails if c.severity != "fail" and _concerns(c.name, metric)})
        cliff = metric in TAILS and any(c.name == check_name(metric) and c.status == "fail" for c in fails)
        if cliff:
            side.cliffs.append(row.point_id)
        side.checks.update(fail_names + warn_names)
        if row.status != "ok":
            error = row.error
            side.invalid.append(Reason(Why.POINT_STATUS, point=row.point_id,
                                       detail=f"{row.status}" + (f" ({error})" if error else "")))
        elif fail_names or not row.valid:
            side.invalid.append(Reason(Why.FAILED_CHECK, point=row.point_id, checks=tuple(fail_names)))
        if row.cache_policy == "keep":
            side.flags.setdefault("prefix cache kept between points (cache = keep)", []).append(row.point_id)
        for name in warn_names:  # a cliff is said by the score's reason (Why.ON_A_CLIFF), not as a flag
            if not (name == "cache_cold" and row.cache_policy == "keep") and not (cliff and name in STABILITY):
                side.flags.setdefault(f"warning {name}", []).append(row.point_id)
        value = row.metric(metric)
        if value is not None and math.isfinite(value):
            at = design.point(row.point_id, row.server_id, row.repeat)
            apart = split.get(at.block) if at.block is not None else None
            side.values.append(Obs(row.point_id, value, at.launch, at.block, at.repeat,
                                   at.exchangeable and apart is None, apart or at.why))
        elif row.status == "ok":  # a point that did not finish is already named in `invalid`
            side.lacking.setdefault(_why_missing(metric, value, fails), []).append(row.point_id)
    return side


STABILITY = {check_name(m): m for m in TAILS}  # each tail metric's stability check -> the metric


def _concerns(check: str, metric: str) -> bool:
    """Whether a warn check concerns a hypothesis on the metric: all do but another tail metric's stability."""
    return check not in STABILITY or STABILITY[check] == metric


def _why_missing(metric: str, value: float | None, fails: list[CheckResult]) -> str:
    if value is not None:
        return NOT_FINITE
    if metric in WITHHELD_METRICS and any(c.name == "itl_trusted" and c.status == "fail" for c in fails):
        return WITHHELD
    return NOT_RECORDED


# A start that compiled its graphs is not exchangeable, for a server metric, with the starts of the same run
# that loaded them: vLLM profiles memory with the compiler's allocations in it (H200, Qwen3-8B, fp8 KV: a
# cold start reported 1,628,304 KV tokens, its warm starts 1,635,648 each) and takes twice as long.
COLD_COMPILE = ("its start compiled the graphs (cold compile cache) where this run's other starts loaded them: "
                "its memory profile and start time differ by construction")


def server_side(data: RunData, ids: Sequence[str], metric: str, design: Layout) -> MeasuredSide:
    """The stored servers of one side of a server-metric hypothesis: exactly the plan's server ids,
    each by its latest start (a resumed launch starts its servers again, as "<id>~N")."""
    side = MeasuredSide()
    wanted = set(ids)
    latest: dict[str, ServerRecord] = {}
    for s in data.servers:
        base = base_server_id(s.server_id)
        if base in wanted and (base not in latest or _started(s) >= _started(latest[base])):
            latest[base] = s
    servers = [latest[b] for b in sorted(latest)]
    split = split_blocks(data, design)
    warm_seen = any(s.compile_cache == "warm" for s in data.servers)
    for index, server in enumerate(servers):
        side.rows += 1
        side.point_ids.append(server.server_id)
        if server.status == "failed":
            side.invalid.append(Reason(Why.SERVER_FAILED, point=server.server_id,
                                       detail=str(server.error or "")))
        value = server.metric(metric)
        if value is not None and math.isfinite(float(value)):
            at = design.server(base_server_id(server.server_id), index)
            cold = compiled_apart(server, metric, warm_seen)
            apart = split.get(at.block) if at.block is not None else None
            side.values.append(Obs(server.server_id, float(value), at.launch, at.block, at.repeat,
                                   not cold and apart is None, apart or (COLD_COMPILE if cold else "")))
        elif metric in MACHINE_METRICS:  # measured before the server started: its own reason, failed or not
            side.lacking.setdefault(NOT_FINITE if value is not None else _not_calibrated(server), []).append(
                server.server_id)
        elif server.status != "failed":  # a failed server is already named in `invalid`
            side.lacking.setdefault(NOT_FINITE if value is not None else SERVER_NOT_RECORDED, []).append(
                server.server_id)
    return side


def compiled_apart(server: ServerRecord, metric: str, warm_seen: bool) -> bool:
    """Whether `server`'s value of `metric` is left out (COLD_COMPILE): its start compiled the graphs where
    the run's other starts loaded them (`warm_seen`). A machine metric is measured before the server starts,
    so its compile cache does not touch it."""
    return warm_seen and server.compile_cache == "cold" and metric not in MACHINE_METRICS


def _not_calibrated(server: ServerRecord) -> str:
    """Why a server has no machine metric: its launch's calibration failed (its reason), or none was stored."""
    if server.calibration_error:
        return server.calibration_error
    return NOT_CALIBRATED


def _started(server: ServerRecord) -> float:
    return server.started_at.timestamp() if server.started_at else float("-inf")

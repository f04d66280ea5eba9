"""The charts of a study page: the run's points turned into chart rows (report.pages.charts draws them).
Repeats are kept as rows; the charts aggregate them to a mean with its min-max spread per arm, workload
and rung: `concurrency` in a closed-loop study, `rate_rps` in an open-loop one. A quantity that is 0 on every point is one line of text, not a chart.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from base import format as fmt
from compiler.capacity import replay
from compiler.load import LoadedStudy
from compiler.modelmath import ModelShape, decode_placement, roofline_flops_per_s
from report.pages import charts
from report.pages.page_models import Chart
from report.results import RunData
from report.scoring.capacity import probe_rows, wilson
from report.scoring.context import StudyContext
from runner.store.records import PointRecord, TelemetrySample
from runner.store.store import Store

# What the over-time charts embed (charts.thin_series): the samples their lines draw, not every one.
THINNED = (f" (per quantity and pixel column of {charts.WIDTH}, its first, last, lowest and highest sample: "
           "the line looks the same as drawn from every sample).")


def _rung(p: PointRecord) -> dict[str, Any]:
    """The point's rung as a chart row's field: its concurrency (closed loop) or its rate (open loop)."""
    return {"concurrency": p.concurrency} if p.concurrency is not None else {"rate_rps": p.rate_rps}


def _ladder(loaded: LoadedStudy) -> charts.Ladder:
    load = loaded.study.load
    closed = load.concurrency or (load.search is not None and load.search.over == "concurrency")
    return charts.CONCURRENCY if closed else charts.RATE


def _capacity(ctx: StudyContext, data: RunData, ladder: charts.Ladder) -> Chart | None:
    """SLO attainment against load per arm with each launch's capacity marked (a capacity search study)."""
    searches = [q for launch in ctx.plan.launches for q in launch.searches] if ctx.plan else []
    probes, marks = [], []
    for q in searches:
        launch = q.id.rsplit("/", 2)[0]
        rows = probe_rows(data, q)
        for r in rows:
            if r.attainment is not None:
                low, high = wilson(round(r.attainment * r.requests), r.requests) or (r.attainment, r.attainment)
                probes.append({"arm": q.arm, "launch": launch, "workload": q.workload, ladder.field: r.level,
                               "attainment": r.attainment, "low": low, "high": high})
        _, found = replay(q, {r.level: r.held for r in rows})
        if found.capacity is not None:
            marks.append({"arm": q.arm, "launch": launch, "capacity": found.capacity})
    if not probes:
        return None
    target = searches[0].attainment
    return Chart("capacity", "SLO attainment against load", f"Share of each probe's requests meeting every "
                 f"objective of [slo] vs {ladder.title}, one line per launch's search (rule: the 95% Wilson "
                 f"interval of the share); dashed: the {fmt.percent(target)} a level must hold; dotted vertical: "
                 "each launch's capacity, the highest level that held.",
                 charts.spec(charts.capacity_chart(probes, marks, target, ladder)))


def _workload(ctx: StudyContext, data: RunData) -> Chart | None:
    """What the shaped workloads sent (drawn lengths, shared prefixes, conversations, a trace), read from the
    stored requests of each such workload's first valid point: the lengths and send times measured, not drawn
    again. None when every workload is the classic fixed-length one."""
    shaped = sorted(name for name, work in ctx.study.workloads.items() if not work.classic)
    firsts: dict[str, PointRecord] = {}
    for p in sorted(data.points, key=lambda p: p.point_id):
        if p.workload in shaped and p.status == "ok" and p.valid:
            firsts.setdefault(p.workload, p)
    if not firsts:
        return None
    lengths: list[dict[str, Any]] = []
    arrivals: list[dict[str, Any]] = []
    hits: list[str] = []
    with Store(data.db, read_only=True) as store:
        for name, point in sorted(firsts.items()):
            sent = [r for r in store.request_records(data.run.run_id, point.point_id) if not r.warmup and r.ok]
            t0 = min((r.scheduled_s for r in sent), default=0.0)
            for r in sent:
                lengths += [{"workload": name, "what": "prompt tokens", "tokens": r.prompt_tokens},
                            {"workload": name, "what": "output tokens", "tokens": r.output_tokens}]
                arrivals.append({"workload": name, "offset_s": round(r.scheduled_s - t0, 4), "turn": r.turn})
            rate = point.metric("prefix_hit_rate")
            hits.append(f"{name}: {len(sent)} requests of {point.point_id}, prefix-cache hit rate "
                        f"{fmt.percent(rate) if rate is not None else 'not recorded'}")
    if not lengths:
        return None
    return Chart("workload", "What the workloads sent", "Each shaped workload's first valid point, from its "
                 "stored requests: the prompt and output tokens of its completed measured requests, and when each "
                 "was scheduled (rows: turns of a conversation). Shared prefixes: " + "; ".join(hits) + ".",
                 charts.spec(charts.workload_chart(lengths, arrivals)))


def _point_rows(data: RunData, metric: str, key: str, scale: float = 1.0) -> list[dict[str, Any]]:
    return [{"arm": p.arm, "workload": p.workload, **_rung(p), "repeat": p.repeat, key: scale * v}
            for p in data.points if p.status == "ok" and (v := p.metric(metric)) is not None]


def study_charts(ctx: StudyContext, data: RunData) -> tuple[list[Chart], list[str]]:
    """The charts of the context's run (`data`, the run of `ctx`) and a note for each chart not drawn."""
    study = ctx.study
    ladder = _ladder(ctx.loaded)
    ok = [p for p in data.points if p.status == "ok"]
    out: list[Chart] = []
    notes: list[str] = []
    panels = " One panel per workload." if len(study.workloads) > 1 else ""

    tput = _point_rows(data, "output_throughput", "value")
    if tput:
        out.append(Chart("throughput", "Output throughput", f"Output tokens/s vs {ladder.title}; line: mean over "
                         f"repeats, vertical rule: min-max over repeats, dots: repeats.{panels}",
                         charts.spec(charts.throughput_chart(tput, ladder))))
    else:
        notes.append("no output throughput measured")
    for stem, what in (("ttft", "TTFT"), ("itl", "ITL")):
        rows = [{"arm": p.arm, "workload": p.workload, **_rung(p), "stat": stat, "value_ms": 1e3 * v}
                for p in ok for stat in ("p50", "p95") if (v := p.metric(f"{stem}_{stat}_s")) is not None]
        if rows:
            out.append(Chart(stem, f"{what} p50 and p95", f"{what} percentiles vs {ladder.title} (solid: p50, "
                             f"dashed: p95); mean over repeats with the min-max spread.{panels}",
                             charts.spec(charts.latency_chart(rows, what, ladder))))
        else:
            notes.append(f"no {what} measured")
    capacity = _capacity(ctx, data, ladder)
    if capacity is not None:
        out.append(capacity)
    workload = _workload(ctx, data)
    if workload is not None:
        out.append(workload)
    roof, why = _roofline(ctx, data)
    if roof is not None:
        out.append(roof)
    else:
        notes.append(f"roofline not drawn: {why}")

    hits = _point_rows(data, "prefix_hit_rate", "hit_rate")
    cold = study.checks.max_cold_hit_rate
    if not hits:
        notes.append("no prefix-cache hit rates recorded")
    elif charts.all_zero(hits, "hit_rate"):
        out.append(Chart("cache", "Prefix-cache hit rate", "", None,
                         summary=f"0% on all {len(hits)} points (a cold point may show up to {fmt.percent(cold)})."))
    else:
        out.append(Chart("cache", "Prefix-cache hit rate", f"Hit rate over each point's measured requests "
                         f"(counter deltas) vs {ladder.title}: mean over repeats, rule: min-max; dashed: the most "
                         f"a cold point may show.{panels}",
                         charts.spec(charts.cache_hit_chart(hits, cold, ladder))))
    little = _point_rows(data, "littles_law_error", "error")
    tol = study.checks.littles_law_tolerance
    if not little:
        notes.append("no Little's Law errors recorded")
    elif charts.all_zero(little, "error"):
        out.append(Chart("littles-law", "Little's Law error", "", None,
                         summary=f"0% on all {len(little)} points (tolerance {fmt.percent(tol)})."))
    else:
        out.append(Chart("littles-law", "Little's Law error", f"|L − λW| / L vs {ladder.title}: mean over repeats, "
                         "rule: min-max; dashed: the study's tolerance. Above it, the measurement window does "
                         f"not describe a steady state.{panels}",
                         charts.spec(charts.littles_law_chart(little, tol, ladder))))
    gpu = _series_rows(data.telemetry, "nvml", (("sm_clock_mhz", "SM clock (MHz)"), ("power_w", "power (W)"),
                                                 ("mem_clock_mhz", "memory clock (MHz)"), ("temp_c", "temperature (°C)")))
    if gpu:
        out.append(Chart("clocks", "Clocks and power over time", "NVML samples during the measured points" + THINNED,
                         charts.spec(charts.timeseries_chart(gpu, "GPU"))))
    else:
        notes.append("no NVML telemetry (no GPU visible to the runner): clocks and power not charted")
    engine = _series_rows(data.telemetry, "metrics", (("running", "requests running"),
                                                      ("waiting", "requests waiting"),
                                                      ("kv_cache_usage", "KV-cache usage")))
    if engine:
        out.append(Chart("engine", "Engine state over time",
                         "vLLM /metrics scraped during the measured points" + THINNED,
                         charts.spec(charts.timeseries_chart(engine, "vLLM"))))
    return out, notes


def _series_rows(telemetry: Sequence[TelemetrySample], source: str,
                 fields: Sequence[tuple[str, str]]) -> list[dict[str, Any]]:
    rows = []
    for t in telemetry:
        if t.source != source or t.t_s is None:
            continue
        for key, label in fields:
            v = getattr(t, key)
            if v is not None and math.isfinite(float(v)):
                rows.append({"t_s": round(float(t.t_s), 3), "quantity": label, "value": float(v)})
    rows.sort(key=lambda r: (r["quantity"], r["t_s"]))
    return rows


def _series(loaded: LoadedStudy, arm: str, workload: str) -> str:
    return arm if len(loaded.study.workloads) == 1 else f"{arm} · {workload}"


def _roofline(ctx: StudyContext, data: RunData) -> tuple[Chart | None, str]:
    study, loaded = ctx.study, ctx.loaded
    cal, spec, calibrated = ctx.calibrated_hw, ctx.spec_hw, ctx.calibrated
    if spec is None or cal is None:
        return None, f"unknown hardware {study.study.hardware!r}"
    shapes: dict[str, tuple[ModelShape, str, str]] = {}
    for arm in study.arms:
        model = ctx.model(arm)
        if model.folder is None:
            return None, f"arm {arm} names no local config.json"
        if model.shape is None:
            return None, str(model.error)
        shapes[arm] = (model.shape, model.dtype, model.kv_dtype)
    points: list[dict[str, Any]] = []
    for p in data.points:
        tput = p.metric("output_throughput")
        if p.status != "ok" or not tput or p.arm not in shapes or p.workload not in study.workloads:
            continue
        shape, dtype, kv = shapes[p.arm]
        means = study.workloads[p.workload].mean_lengths
        if means is None:  # a replayed trace: its lengths are in its file, not the study
            continue
        ladder_value = p.concurrency if p.concurrency is not None else p.rate_rps
        batch = max(1.0, p.metric("mean_in_flight") or float(ladder_value or 0.0))
        placed = decode_placement(shape, dtype, kv, cal, batch, means[0] + means[1] / 2, tput)
        points.append({"series": _series(loaded, p.arm, p.workload), **_rung(p),
                       "intensity": placed.intensity, "flops_per_s": placed.flops_per_s, "fraction": placed.fraction})
    if not points:
        return None, "no output throughput measured"
    cards = [(f"spec sheet ({spec.name}, {spec.source})", spec)]
    if calibrated:
        cards.append(("calibrated (measured this run)", cal))
    lo = min(min(p["intensity"] for p in points) / 4, min(c.ridge for _, c in cards) / 8)
    hi = max(max(p["intensity"] for p in points) * 4, max(c.ridge for _, c in cards) * 8)
    steps = 48
    ceilings = [{"ceiling": label, "intensity": x, "flops_per_s": roofline_flops_per_s(card, x)}
                for label, card in cards for x in (lo * (hi / lo) ** (i / steps) for i in range(steps + 1))]
    caption = ("Each measured point's decode step placed by the model math: intensity = FLOPs / bytes read "
               "(weights + KV at the mean batch in flight and mid-output context); attained = FLOPs per token "
               "× output tokens/s. Lines: min(peak FLOP/s, bandwidth × intensity), one dash style per ceiling.")
    if not calibrated:
        caption += " The run was not calibrated: only the spec-sheet ceiling is shown."
    roof = charts.roofline_chart(points, ceilings, _ladder(loaded))
    return Chart("roofline", "Roofline placement", caption, charts.spec(roof)), ""

"""Page contexts of the site: one frozen dataclass per page, gathered from studies, runs and scores
before anything is written. Numbers are formatted here; templates only place strings.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from compiler.hardware import Hardware
from compiler.load import LoadedStudy
from compiler.modelmath import ModelError, ModelShape, describe, load_model
from compiler.study import Study
from report import charts
from report.audit import fmt, fmt_pct
from report.results import RunData
from report.scoring import NOT_CALIBRATED, Score, hardware_pair, model_dir, serving_dtypes, verdict_counts
from report.seed import SeedNote, seed_note
from runner.records import TelemetrySample

DOWNLOADS = (("points", "csv"), ("points", "parquet"), ("requests", "csv"), ("requests", "parquet"),
             ("checks", "csv"))


@dataclass(frozen=True)
class Chart:
    id: str
    title: str
    caption: str
    spec: dict[str, Any]


@dataclass(frozen=True)
class Fact:
    label: str
    value: str


@dataclass(frozen=True)
class Link:
    href: str
    text: str


@dataclass(frozen=True)
class VerdictCount:
    verdict: str
    count: int


@dataclass(frozen=True)
class StudyRow:
    """One study on the index page."""

    id: str
    title: str
    href: str
    counts: tuple[VerdictCount, ...]
    hardware: str
    engine: str
    date: str
    host: str


@dataclass(frozen=True)
class IndexPage:
    root: str
    title: str
    built: str
    studies: tuple[StudyRow, ...]
    totals: tuple[VerdictCount, ...]


@dataclass(frozen=True)
class HypothesisRow:
    anchor: str
    id: str
    claim: str
    source: str
    metric: str
    where: str
    prediction: str
    predicted: str
    predicted_spec: str
    measured: str
    interval: str
    spread: str
    n: int
    error: str
    error_spec: str
    verdict: str
    verdict_spec: str
    checks: str
    flags: tuple[str, ...]
    notes: tuple[str, ...]


@dataclass(frozen=True)
class ArgChange:
    sign: str  # "+" added by the arm, "~" changed from the base
    key: str
    value: str
    base: str


@dataclass(frozen=True)
class ArmRow:
    name: str
    description: str
    changes: tuple[ArgChange, ...]
    extras: tuple[str, ...]


@dataclass(frozen=True)
class ModelBlock:
    folder: str
    arms: str
    facts: tuple[Fact, ...]
    error: str


@dataclass(frozen=True)
class CalibrationRow:
    quantity: str
    spec: str
    measured: str
    ratio: str


@dataclass(frozen=True)
class CheckRow:
    point: str
    name: str
    severity: str
    passed: bool
    value: str
    threshold: str
    detail: str


@dataclass(frozen=True)
class StudyPage:
    root: str
    title: str
    study_id: str
    question: str
    notes: str
    source: str
    study_path: str
    has_run: bool
    calibrated: bool
    counts: tuple[VerdictCount, ...]
    seed: SeedNote | None  # "Against the seed": None when no hypothesis quotes its seed
    models: tuple[ModelBlock, ...]
    base_engine: tuple[Fact, ...]
    arms: tuple[ArmRow, ...]
    workloads: tuple[tuple[str, ...], ...]
    load: tuple[Fact, ...]
    provenance: tuple[Fact, ...]
    calibration: tuple[CalibrationRow, ...]
    hypotheses: tuple[HypothesisRow, ...]
    charts: tuple[Chart, ...]
    chart_notes: tuple[str, ...]
    problems: tuple[CheckRow, ...]
    checks_total: int
    checks_passed: int
    points_total: int
    downloads: tuple[Link, ...]
    warnings: tuple[str, ...]


@dataclass(frozen=True)
class AuditRow:
    study: str
    study_href: str
    hypothesis: str
    claim: str
    metric: str
    prediction: str
    predicted_spec: str
    measured: str
    interval: str
    n: int
    error: str
    verdict: str
    verdict_spec: str
    checks: str


@dataclass(frozen=True)
class AuditPage:
    root: str
    title: str
    built: str
    rows: tuple[AuditRow, ...]
    totals: tuple[VerdictCount, ...]
    chart: Chart | None
    left_out: tuple[str, ...]


# -- helpers -----------------------------------------------------------------------------------------


def date_text(value: datetime | None) -> str:
    return "-" if value is None else value.strftime("%Y-%m-%d %H:%M UTC")


def built_text(runs: Sequence[RunData]) -> str:
    """A reproducible build date: the latest run's end, never the clock."""
    ends = [r.finished_at for r in runs if r.finished_at is not None]
    return date_text(max(ends)) if ends else "no runs"


def counts_of(scores: Sequence[Score]) -> tuple[VerdictCount, ...]:
    return tuple(VerdictCount(v, c) for v, c in verdict_counts(scores).items())


def study_href(study_id: str) -> str:
    return f"studies/{study_id}/index.html"


def _bytes(x: float | None) -> str:
    if x is None:
        return "-"
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(x) >= size:
            return f"{x / size:.4g} {unit}"
    return f"{x:.4g} B"


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict | list):
        return json.dumps(value, sort_keys=True)
    return str(value)


def _num(x: float | None, digits: int = 4) -> str:
    return "-" if x is None else f"{x:,.{digits}g}"


# -- index and audit ---------------------------------------------------------------------------------


def index_page(studies: Sequence[LoadedStudy], runs: dict[str, RunData], scores: dict[str, list[Score]]) -> IndexPage:
    rows = []
    for loaded in sorted(studies, key=lambda s: s.study.study.id):
        sid = loaded.study.study.id
        data = runs.get(sid)
        run = data.run if data else None
        engines = sorted({str(v) for v in [run.vllm_version if run else None] + [s.vllm_version for s in
                                                                         (data.servers if data else ())] if v})
        gpu = (run.gpu_name if run else None) or ("no GPU (CPU)" if data else "-")
        rows.append(StudyRow(
            id=sid, title=loaded.study.study.title, href=study_href(sid), counts=counts_of(scores[sid]),
            hardware=f"{gpu} · predicted for {loaded.study.study.hardware}",
            engine=", ".join(f"vLLM {e}" for e in engines) or "-",
            date=date_text(data.started_at if data else None), host=str((run.host if run else None) or "-"),
        ))
    every = [s for sid in sorted(scores) for s in scores[sid]]
    return IndexPage(root="", title="studyc results", built=built_text(list(runs.values())),
                     studies=tuple(rows), totals=counts_of(every))


def audit_page(studies: Sequence[LoadedStudy], runs: dict[str, RunData], scores: dict[str, list[Score]]) -> AuditPage:
    rows, points, left_out = [], [], []
    for loaded in sorted(studies, key=lambda s: s.study.study.id):
        sid = loaded.study.study.id
        for s in scores[sid]:
            rows.append(AuditRow(
                study=sid, study_href=f"{study_href(sid)}#h-{s.hypothesis}", hypothesis=s.hypothesis,
                claim=s.claim, metric=s.metric, prediction=_prediction(s), predicted_spec=fmt(s.predicted_spec, s.unit),
                measured=fmt(s.measured, s.unit), interval=_interval(s), n=s.n, error=fmt_pct(s.error),
                verdict=s.verdict, verdict_spec=s.verdict_spec, checks=", ".join(s.checks),
            ))
            point = _scatter_row(s)
            if point is not None:
                points.append(point)
            elif s.measured is not None:
                left_out.append(f"{sid}/{s.hypothesis}: not positive, cannot sit on log axes")
    chart = None
    if points:
        chart = Chart("audit", "Predicted vs measured", "Dots: measured mean, colored by verdict; thin rules: "
                      "95% interval; wide bars: the prediction's tolerance band or range (one-sided for "
                      "relations); dashed: y = x.", charts.spec(charts.audit_scatter(points)))
    return AuditPage(root="", title="Audit: every prediction", built=built_text(list(runs.values())),
                     rows=tuple(rows), totals=counts_of([s for v in scores.values() for s in v]), chart=chart,
                     left_out=tuple(left_out))


def _scatter_row(s: Score) -> dict[str, Any] | None:
    if s.predicted is None or s.measured is None or s.predicted <= 0 or s.measured <= 0:
        return None
    return {
        "label": f"{s.study_id}/{s.hypothesis}", "claim": s.claim, "verdict": s.verdict,
        "predicted": s.predicted, "measured": s.measured, "ci_low": s.ci_low, "ci_high": s.ci_high,
        "band_low": s.band_low, "band_high": s.band_high,
    }


def _prediction(s: Score) -> str:
    if s.predicted is None:
        return "(not evaluated)"
    u = s.unit
    if s.kind == "range":
        return f"in [{fmt(s.band_low, u)}, {fmt(s.band_high, u)}]"
    if s.kind == "relation":
        return f"{s.relation} {fmt(s.predicted, u)}"
    return f"{fmt(s.predicted, u)} ± {100 * (s.tolerance or 0):g}%"


def _interval(s: Score) -> str:
    if s.ci_low is None:
        return "-"
    return f"[{fmt(s.ci_low, s.unit)}, {fmt(s.ci_high, s.unit)}]"


# -- study page ----------------------------------------------------------------------------------------


def study_page(loaded: LoadedStudy, data: RunData | None, scores: Sequence[Score]) -> StudyPage:
    study = loaded.study
    meta = study.study
    warnings: list[str] = []
    hyps = tuple(_hypothesis_row(study, s) for s in scores)
    for s in scores:
        if s.verdict == "not run" and data is not None:
            warnings.append(f"{meta.id}/{s.hypothesis}: not measured ({'; '.join(s.notes) or 'no data'})")
        if s.predicted is None:
            warnings.append(f"{meta.id}/{s.hypothesis}: prediction not evaluated ({'; '.join(s.notes)})")
    if data is None:
        warnings.append(f"{meta.id}: no run in the results database(s)")
    elif data.run.study_sha256 and data.run.study_sha256 != loaded.sha256:
        warnings.append(f"{meta.id}: {loaded.path} changed since run {data.run_id} (its hash differs)")

    problems, checks_total, checks_passed = _checks(data)
    for c in problems:
        if c.severity == "fail":
            warnings.append(f"{meta.id}: point {c.point} failed check {c.name}: {c.detail}")
    for p in data.points if data else ():
        if p.status != "ok":
            warnings.append(f"{meta.id}: point {p.point_id} status {p.status}: {p.error or ''}".rstrip(": "))

    chart_list, chart_notes = study_charts(loaded, data) if data else ((), ("no run: nothing to chart",))
    return StudyPage(
        root="../../", title=meta.title, study_id=meta.id, question=meta.question, notes=meta.notes,
        source=meta.source, study_path=str(loaded.path), has_run=data is not None,
        calibrated=hardware_pair(study, data.run if data else None)[2], counts=counts_of(scores),
        seed=seed_note(loaded, scores, data.run if data else None),
        models=_models(loaded, data), base_engine=tuple(Fact(f"--{k.replace('_', '-')}", _value(v))
                                                        for k, v in sorted(study.engine.items())),
        arms=_arms(study), workloads=_workloads(study), load=_load(study), provenance=_provenance(loaded, data),
        calibration=_calibration(study, data), hypotheses=hyps, charts=tuple(chart_list),
        chart_notes=tuple(chart_notes), problems=tuple(problems), checks_total=checks_total,
        checks_passed=checks_passed, points_total=len(data.points) if data else 0,
        downloads=tuple(Link(f"data/{t}.{f}", f"{t}.{f}") for t, f in DOWNLOADS) if data else (),
        warnings=tuple(warnings),
    )


def _hypothesis_row(study: Study, s: Score) -> HypothesisRow:
    hyp = next(h for h in study.hypothesis if h.id == s.hypothesis)
    where = " ÷ ".join(s.targets) if s.targets else "-"
    spread = "-" if s.spread_low is None else f"{fmt(s.spread_low, s.unit)} – {fmt(s.spread_high, s.unit)}"
    return HypothesisRow(
        anchor=f"h-{s.hypothesis}", id=s.hypothesis, claim=s.claim, source=hyp.source, metric=s.metric,
        where=where, prediction=_prediction(s), predicted=fmt(s.predicted, s.unit),
        predicted_spec=fmt(s.predicted_spec, s.unit), measured=fmt(s.measured, s.unit), interval=_interval(s),
        spread=spread, n=s.n, error=fmt_pct(s.error), error_spec=fmt_pct(s.error_spec), verdict=s.verdict,
        verdict_spec=s.verdict_spec, checks=", ".join(s.checks), flags=s.flags,
        notes=tuple(n for n in s.notes if n != NOT_CALIBRATED),  # said once, above the table
    )


def _models(loaded: LoadedStudy, data: RunData | None) -> tuple[ModelBlock, ...]:
    study = loaded.study
    cal, spec, calibrated = hardware_pair(study, data.run if data else None)
    by_folder: dict[str, list[str]] = {}
    for arm in sorted(study.arms):
        folder = model_dir(loaded, arm)
        by_folder.setdefault(folder or f"(hub: {study.model.name})", []).append(arm)
    blocks = []
    for folder, arms in sorted(by_folder.items()):
        facts: list[Fact] = []
        error = ""
        try:
            if spec is None or folder.startswith("(hub"):
                raise ModelError("no local config.json to describe")
            shape = load_model(folder)
            dtype, kv = serving_dtypes(study, arms[0], shape)
            facts = _model_facts(shape, dtype, kv, spec, cal if calibrated else None)
        except (ModelError, ValueError) as exc:
            error = str(exc)
        blocks.append(ModelBlock(folder=folder, arms=", ".join(arms), facts=tuple(facts), error=error))
    return tuple(blocks)


def _model_facts(shape: ModelShape, dtype: str, kv: str, spec: Hardware, cal: Hardware | None) -> list[Fact]:
    d = describe(shape, batch=1, context=None, dtype=dtype, kv_dtype=kv, hardware=spec)
    facts = [
        Fact("model", f"{d['name']} ({d['family']})"),
        Fact("parameters", f"{d['params']:,} (active per token {d['active_params']:,})"),
        Fact("weights", f"{_bytes(d['weight_bytes'])} at {d['dtype']}"),
        Fact("KV cache per token", f"{d['kv_bytes_per_token']:,} B at kv dtype {d['kv_dtype']}"),
        Fact("bytes read per decode step (batch 1)", _bytes(d["decode_weight_bytes"])),
        Fact("FLOPs per decode step (batch 1)", f"{d['decode_flops']:.4g}"),
        Fact(f"batch-1 decode roofline, {spec.name} {spec.source}",
             f"{d['decode_tokens_per_s_roofline']:,.1f} tok/s ({d['bound']} bound)"),
    ]
    if cal is not None:
        c = describe(shape, batch=1, context=None, dtype=dtype, kv_dtype=kv, hardware=cal)
        facts.append(Fact("batch-1 decode roofline, calibrated",
                          f"{c['decode_tokens_per_s_roofline']:,.1f} tok/s ({c['bound']} bound)"))
    return facts


def _arms(study: Study) -> tuple[ArmRow, ...]:
    rows = []
    for name, arm in sorted(study.arms.items()):
        changes = []
        for key, value in sorted(arm.args.items()):
            flag = f"--{key.replace('_', '-')}"
            if key in study.engine:
                if study.engine[key] != value:
                    changes.append(ArgChange("~", flag, _value(value), _value(study.engine[key])))
            else:
                changes.append(ArgChange("+", flag, _value(value), ""))
        extras = []
        if arm.cache:
            extras.append(f"cache = {arm.cache}")
        if arm.model:
            extras.append(f"model = {arm.model}")
        extras += [f"env {k}={v}" for k, v in sorted(arm.env.items())]
        if arm.replicas != 1:
            extras.append(f"replicas = {arm.replicas}")
        rows.append(ArmRow(name, arm.description, tuple(changes), tuple(extras)))
    return tuple(rows)


def _workloads(study: Study) -> tuple[tuple[str, ...], ...]:
    return tuple((name, f"{w.input_len:,}", f"{w.output_len:,}", f"{w.prefix_len:,}", str(w.seed))
                 for name, w in sorted(study.workloads.items()))


def _load(study: Study) -> tuple[Fact, ...]:
    load = study.load
    facts = [Fact("closed loop: concurrency" if load.concurrency else f"open loop ({load.arrival}): rate req/s",
                  ", ".join(f"{lv:g}" for lv in load.levels)),
             Fact("measured requests per point", _value(load.requests)), Fact("warmup requests", str(load.warmup)),
             Fact("repeats (interleaved)", str(load.repeats)), Fact("prefix cache", load.cache),
             Fact("servers", load.server)]
    if load.rate and load.arrival == "gamma":
        facts.append(Fact("burstiness", f"{load.burstiness:g}"))
    return tuple(facts)


def _provenance(loaded: LoadedStudy, data: RunData | None) -> tuple[Fact, ...]:
    facts = [Fact("study file", f"{loaded.path} (sha256 {loaded.sha256[:12]})")]
    if data is None:
        return tuple(facts + [Fact("run", "none in the results database(s)")])
    run = data.run
    same = run.study_sha256 == loaded.sha256
    servers = data.servers
    vllm = sorted({str(v) for v in [run.vllm_version] + [s.vllm_version for s in servers] if v})
    torch = sorted({str(v) for v in [run.torch_version] + [s.torch_version for s in servers] if v})
    facts += [
        Fact("run", f"{data.run_id} ({run.status or '-'})"),
        Fact("study file at run time", f"sha256 {str(run.study_sha256 or '-')[:12]}"
             + ("" if same else " — differs from the file now")),
        Fact("started", date_text(data.started_at)),
        Fact("finished", date_text(run.finished_at)),
        Fact("host", str(run.host or "-")),
        Fact("results database", data.db.name),
        Fact("GPU", str(run.gpu_name or "none (CPU)")),
        Fact("driver", str(run.driver_version or "-")),
        Fact("vLLM", ", ".join(vllm) or "-"),
        Fact("torch", ", ".join(torch) or "-"),
        Fact("studyc", f"{run.studyc_version or '-'} (git {str(run.git_sha or '-')[:10]})"),
        Fact("engine command", str(run.engine_command or "-")),
        Fact("load generator ceiling", "-" if not run.client_ceiling_chunks_per_s
             else f"{run.client_ceiling_chunks_per_s:,.0f} chunks/s"),
    ]
    for s in sorted(servers, key=lambda s: s.server_id):
        facts.append(Fact(f"server {s.server_id}",
                          f"{s.status or '-'}; start {_num(s.startup_s, 3)} s; "
                          f"KV capacity {_num(s.kv_capacity_tokens, 9)} tokens"))
    return tuple(facts)


def _calibration(study: Study, data: RunData | None) -> tuple[CalibrationRow, ...]:
    _, spec, calibrated = hardware_pair(study, data.run if data else None)
    if spec is None:
        return ()
    run = data.run if data else None

    try:
        reason = json.loads((run.calibration_json if run else None) or "{}").get("reason") or ""
    except (ValueError, AttributeError):
        reason = ""
    missing = f"not calibrated: {reason}" if reason else "not calibrated"

    def row(label: str, spec_v: float, measured: float | None, unit: str, scale: float) -> CalibrationRow:
        return CalibrationRow(
            f"{label} ({unit})", f"{spec_v / scale:,.4g} ({spec.name}, {spec.source})",
            missing if not (calibrated and measured) else f"{measured / scale:,.4g}",
            "-" if not (calibrated and measured) else f"{measured / spec_v:.1%} of spec",
        )

    return (row("memory bandwidth", spec.bandwidth_Bps, run.bandwidth_Bps if run else None, "GB/s", 1e9),
            row("dense bf16 matmul", spec.flops_bf16, run.flops_bf16 if run else None, "TFLOP/s", 1e12))


def _checks(data: RunData | None) -> tuple[list[CheckRow], int, int]:
    if data is None:
        return [], 0, 0
    rows = [CheckRow(c.point_id, c.name, c.severity, c.passed,
                     _num(c.value), _num(c.threshold), c.detail or "")
            for c in data.checks]
    problems = sorted((r for r in rows if not r.passed), key=lambda r: (r.point, r.name))
    return problems, len(rows), sum(1 for r in rows if r.passed)


# -- charts --------------------------------------------------------------------------------------------


def _series(study: Study, arm: str, workload: str) -> str:
    return arm if len(study.workloads) == 1 else f"{arm} · {workload}"


def study_charts(loaded: LoadedStudy, data: RunData) -> tuple[list[Chart], list[str]]:
    study = loaded.study
    level_title = "concurrency" if study.load.concurrency else "rate (req/s)"
    ok = [p for p in data.points if p.status == "ok"]
    out: list[Chart] = []
    notes: list[str] = []

    tput = [{"series": _series(study, p.arm, p.workload), "level": p.level, "repeat": p.repeat,
             "value": p.metric("output_throughput")} for p in ok if p.metric("output_throughput") is not None]
    if tput:
        out.append(Chart("throughput", "Output throughput", f"Output tokens/s vs {level_title}; line: mean over "
                         "repeats, rule: min-max spread, dots: repeats.",
                         charts.spec(charts.throughput_chart(tput, level_title))))
    else:
        notes.append("no output throughput measured")
    for stem, what in (("ttft", "TTFT"), ("itl", "ITL")):
        rows = [{"series": _series(study, p.arm, p.workload), "level": p.level, "stat": stat,
                 "value_ms": 1e3 * v}
                for p in ok for stat in ("p50", "p95") if (v := p.metric(f"{stem}_{stat}_s")) is not None]
        if rows:
            out.append(Chart(stem, f"{what} p50 and p95", f"{what} percentiles vs {level_title}; mean over "
                             "repeats with the min-max spread.",
                             charts.spec(charts.latency_chart(rows, what, level_title))))
        else:
            notes.append(f"no {what} measured")
    roof, why = _roofline(loaded, data)
    if roof is not None:
        out.append(roof)
    else:
        notes.append(f"roofline not drawn: {why}")
    order = {p.point_id: i for i, p in enumerate(data.points)}
    short = {p.point_id: p.point_id.removeprefix(f"{study.study.id}/") for p in data.points}
    hits = [{"point": short[p.point_id], "order": order[p.point_id], "series": _series(study, p.arm, p.workload),
             "hit_rate": p.metric("prefix_hit_rate")} for p in ok if p.metric("prefix_hit_rate") is not None]
    if hits:
        out.append(Chart("cache", "Prefix-cache hit rate per point", "Hit rate over each point's measured "
                         "requests (counter deltas); dashed: the most a cold point may show.",
                         charts.spec(charts.cache_hit_chart(hits, study.checks.max_cold_hit_rate))))
    else:
        notes.append("no prefix-cache hit rates recorded")
    little = [{"point": short[p.point_id], "order": order[p.point_id], "series": _series(study, p.arm, p.workload),
               "error": p.metric("littles_law_error")} for p in ok if p.metric("littles_law_error") is not None]
    if little:
        out.append(Chart("littles-law", "Little's Law error per point", "|L − λW| / L per point; dashed: the "
                         "study's tolerance. Above it, the measurement window does not describe a steady state.",
                         charts.spec(charts.littles_law_chart(little, study.checks.littles_law_tolerance))))
    else:
        notes.append("no Little's Law errors recorded")
    gpu = _series_rows(data.telemetry, "nvml", (("sm_clock_mhz", "SM clock (MHz)"), ("power_w", "power (W)"),
                                                 ("mem_clock_mhz", "memory clock (MHz)"), ("temp_c", "temperature (°C)")))
    if gpu:
        out.append(Chart("clocks", "Clocks and power over time", "NVML samples during the measured points.",
                         charts.spec(charts.timeseries_chart(gpu, "GPU"))))
    else:
        notes.append("no NVML telemetry (no GPU visible to the runner): clocks and power not charted")
    engine = _series_rows(data.telemetry, "metrics", (("running", "requests running"),
                                                      ("waiting", "requests waiting"),
                                                      ("kv_cache_usage", "KV-cache usage")))
    if engine:
        out.append(Chart("engine", "Engine state over time", "vLLM /metrics scraped during the measured points.",
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


def _roofline(loaded: LoadedStudy, data: RunData) -> tuple[Chart | None, str]:
    study = loaded.study
    cal, spec, calibrated = hardware_pair(study, data.run)
    if spec is None or cal is None:
        return None, f"unknown hardware {study.study.hardware!r}"
    shapes: dict[str, tuple[ModelShape, str, str]] = {}
    for arm in study.arms:
        folder = model_dir(loaded, arm)
        if folder is None:
            return None, f"arm {arm} names no local config.json"
        try:
            shape = load_model(folder)
        except ModelError as exc:
            return None, str(exc)
        shapes[arm] = (shape, *serving_dtypes(study, arm, shape))
    points: list[dict[str, Any]] = []
    for p in data.points:
        tput = p.metric("output_throughput")
        if p.status != "ok" or not tput or p.arm not in shapes or p.workload not in study.workloads:
            continue
        shape, dtype, kv = shapes[p.arm]
        w = study.workloads[p.workload]
        batch = max(1.0, p.metric("mean_in_flight") or p.level)
        context = w.input_len + w.output_len / 2
        flops = shape.decode_flops(batch, context)
        intensity = flops / shape.decode_step_bytes(batch, context, dtype, kv)
        attained = flops / batch * tput
        ceiling = min(cal.flops_bf16, cal.bandwidth_Bps * intensity)
        points.append({"series": _series(study, p.arm, p.workload), "level": p.level, "intensity": intensity,
                       "flops_per_s": attained, "fraction": attained / ceiling})
    if not points:
        return None, "no output throughput measured"
    cards = [(f"spec sheet ({spec.name}, {spec.source})", spec)]
    if calibrated:
        cards.append(("calibrated (measured this run)", cal))
    lo = min(min(p["intensity"] for p in points) / 4, min(c.ridge for _, c in cards) / 8)
    hi = max(max(p["intensity"] for p in points) * 4, max(c.ridge for _, c in cards) * 8)
    steps = 48
    ceilings = []
    for label, card in cards:
        for i in range(steps + 1):
            x = lo * (hi / lo) ** (i / steps)
            ceilings.append({"ceiling": label, "intensity": x,
                             "flops_per_s": min(card.flops_bf16, card.bandwidth_Bps * x)})
    caption = ("Each measured point's decode step placed by the model math: intensity = FLOPs / bytes read "
               "(weights + KV at the mean batch in flight and mid-output context); attained = FLOPs per token "
               "× output tokens/s. Lines: min(peak FLOP/s, bandwidth × intensity).")
    if not calibrated:
        caption += " The run was not calibrated: only the spec-sheet ceiling is shown."
    return Chart("roofline", "Roofline placement", caption, charts.spec(charts.roofline_chart(points, ceilings))), ""


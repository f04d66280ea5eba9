"""Page builders: studies, runs and scores in, page contexts (report.pages.page_models) out, gathered before
anything is written. Numbers are formatted here, through base.format and report.scoring.score_text; templates only
place strings. Charts come from report.pages.study_charts; rendering is report.pages.site's.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from base import format as fmt
from compiler.claims import Document
from compiler.hardware import Hardware
from compiler.load import LoadedStudy
from compiler.modelmath import ModelShape, describe
from compiler.study import Study
from compiler.workload import length_text
from report.audit import spec_differs
from report.pages import charts, forest
from report.pages.cost import cost_text, site_cost_text, timing
from report.pages.page_models import (
    ArgChange,
    ArmRow,
    AuditPage,
    AuditRow,
    CalibrationRow,
    Chart,
    CheckRow,
    Fact,
    HypothesisRow,
    IndexPage,
    Link,
    ModelBlock,
    RequestsNote,
    SpecCell,
    StudyPage,
    StudyRow,
    VerdictCount,
    WorkloadRow,
)
from report.pages.seed import seed_note
from report.pages.seed_index import seed_groups
from report.pages.study_charts import study_charts
from report.results import RunData
from report.scoring import score_text
from report.scoring.context import StudyContext
from report.scoring.score_model import Score, Why, verdict_counts
from report.stats.alpha_ledger import ONE_RUN
from runner.store.folder import is_folder

if TYPE_CHECKING:
    from runner.store.records import ServerRecord

# The run's tables a study page offers under data/. Its requests (per-token times: most of a run's bytes) are
# left in the results it was built from; the page says where (requests_note).
DOWNLOADS = (("points", "csv"), ("points", "parquet"), ("checks", "csv"))
EXPORTED = "results-csv"  # the folder the page's `studyc export` command writes


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


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict | list):
        return json.dumps(value, sort_keys=True)
    return str(value)


def _num(x: float | None, digits: int = 4) -> str:
    return "-" if x is None else fmt.significant(float(x), digits)


# -- index and audit ---------------------------------------------------------------------------------


def index_page(studies: Sequence[LoadedStudy], runs: dict[str, RunData], scores: dict[str, list[Score]],
               documents: Sequence[Document] = ()) -> IndexPage:
    """The index; `documents`: the source documents (compiler.claims) its verdicts are grouped under."""
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
            cost=cost_text(data, scores[sid]),
        ))
    every = [s for sid in sorted(scores) for s in scores[sid]]
    return IndexPage(root="", title="studyc results", built=built_text(list(runs.values())),
                     studies=tuple(rows), totals=counts_of(every), cost=site_cost_text(runs, scores),
                     seeds=seed_groups(studies, runs, scores, study_href, documents))


def audit_page(studies: Sequence[LoadedStudy], runs: dict[str, RunData], scores: dict[str, list[Score]]) -> AuditPage:
    rows, labelled = [], []
    for loaded in sorted(studies, key=lambda s: s.study.study.id):
        sid = loaded.study.study.id
        for s in scores[sid]:
            rows.append(AuditRow(
                study=sid, study_href=f"{study_href(sid)}#h-{s.hypothesis}", hypothesis=s.hypothesis,
                claim=s.claim, metric=s.metric, where=_where(s), prediction=score_text.prediction(s, sides=False),
                measured=score_text.mean(s), interval=score_text.interval(s), read_at=score_text.read_at(s), n=s.n,
                off_band=score_text.off_band(s), verdict=s.verdict, verdict_label=s.verdict_label, spec=_spec_cell(s),
                checks=", ".join(s.checks),
            ))
            labelled.append((f"{sid}/{s.hypothesis}", s))
    return AuditPage(root="", title="Audit: every prediction", built=built_text(list(runs.values())),
                     rows=tuple(rows), show_spec=any(r.spec is not None for r in rows),
                     totals=counts_of([s for v in scores.values() for s in v]), chart=forest_figure(labelled))


def forest_figure(labelled: Sequence[tuple[str, Score]]) -> Chart | None:
    """The forest plot of (label, score) pairs (report.pages.forest); None when there is no hypothesis."""
    if not labelled:
        return None
    rows = [forest.forest_row(s, label) for label, s in labelled]
    return Chart("forest", "Predicted and measured, hypothesis by hypothesis", forest.forest_caption(rows),
                 charts.spec(forest.forest_chart(rows)))


def _where(s: Score) -> str:
    if s.ratio:
        return score_text.ratio_sides(s.targets)
    return " ÷ ".join(s.targets) if s.targets else "-"


def _spec_cell(s: Score) -> SpecCell | None:
    """The spec-sheet score, only where it differs from the measured-ceiling one."""
    if not spec_differs(s):
        return None
    return SpecCell(score_text.prediction(s, spec=True, sides=False), score_text.off_band(s, spec=True), s.verdict_spec,
                    s.verdict_spec_label)


# -- study page ----------------------------------------------------------------------------------------


def study_page(ctx: StudyContext, scores: Sequence[Score], changed_since: str = "") -> StudyPage:
    """The study page of a context scored by report.scoring.scoring; `changed_since`: the warning that its file
    changed since the run (report.run_compare.StudyRuns.changed_line)."""
    loaded, data, study = ctx.loaded, ctx.data, ctx.study
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
    elif changed_since:  # notes, comments, a question reworded: the plan the run carried out still stands
        warnings.append(changed_since)

    problems, checks_total, checks_passed = _checks(data)
    for c in problems:
        if c.severity == "fail":
            warnings.append(f"{meta.id}: point {c.point} failed check {c.name}: {c.detail}")
    for p in data.points if data else ():
        if p.status != "ok":
            warnings.append(f"{meta.id}: point {p.point_id} status {p.status}: {p.error or ''}".rstrip(": "))

    chart_list, chart_notes = study_charts(ctx, data) if data else ((), ("no run: nothing to chart",))
    return StudyPage(
        root="../../", title=meta.title, study_id=meta.id, question=meta.question, notes=meta.notes,
        source=meta.source, study_path=str(loaded.path), has_run=data is not None,
        calibrated=ctx.calibrated, counts=counts_of(scores), seed=seed_note(ctx, scores),
        models=_models(ctx), base_engine=tuple(Fact(f"--{k.replace('_', '-')}", _value(v))
                                                        for k, v in sorted(study.engine.items())),
        arms=_arms(study), workloads=_workloads(study), load=_load(study), provenance=_provenance(loaded, data),
        calibration=_calibration(ctx), hypotheses=hyps, show_spec=any(h.spec is not None for h in hyps),
        forest=forest_figure([(s.hypothesis, s) for s in scores]), charts=tuple(chart_list),
        chart_notes=tuple(chart_notes), problems=tuple(problems), checks_total=checks_total,
        checks_passed=checks_passed, points_total=len(data.points) if data else 0,
        downloads=tuple(Link(f"data/{t}.{f}", f"{t}.{f}") for t, f in DOWNLOADS) if data else (),
        requests=requests_note(data) if data else None,
        warnings=tuple(warnings), timing=timing(data) if data else None,
    )


def requests_note(data: RunData) -> RequestsNote:
    """Where the run's requests are, and the `studyc export` command that writes them as CSV. The results are
    named by their path as given to `--db`; an absolute one by its name only (the note names no machine's
    folders, and reads the same wherever the results were copied)."""
    db = (data.db if not data.db.is_absolute() else Path(data.db.name)).as_posix()
    folder = is_folder(data.db)
    stored = f"{db}/{data.run_id}/requests.parquet" if folder else db
    export = f"studyc export --db {shlex.quote(db)} --format csv {EXPORTED}"
    return RequestsNote(data.run_id, folder, stored, export, f"{EXPORTED}/{data.run_id}/requests.csv")


def _hypothesis_row(study: Study, s: Score) -> HypothesisRow:
    hyp = next(h for h in study.hypothesis if h.id == s.hypothesis)
    return HypothesisRow(
        anchor=f"h-{s.hypothesis}", id=s.hypothesis, claim=s.claim, source=hyp.source, metric=s.metric,
        where=_where(s), prediction=score_text.prediction(s, sides=False), measured=score_text.mean(s),
        spread=score_text.spread(s), interval=score_text.interval(s), read_at=score_text.read_at(s), n=s.n,
        off_band=score_text.off_band(s), verdict=s.verdict, verdict_label=s.verdict_label,
        spec=_spec_cell(s), checks=", ".join(s.checks), flags=s.flags,
        notes=tuple(r.text for r in s.reasons if r.why is not Why.NOT_CALIBRATED),  # said once, above the table
        during_run=s.set_aside.verdict if s.set_aside else "",
        during_run_label=s.set_aside.label if s.set_aside else "",
        set_aside=score_text.set_aside(s),
        alpha_ledger=s.alpha_ledger.text if s.alpha_ledger and s.alpha_ledger.case != ONE_RUN else "",
        inconclusive_reason=s.inconclusive_reason or "",
    )


def _models(ctx: StudyContext) -> tuple[ModelBlock, ...]:
    study = ctx.study
    cal, spec, calibrated = ctx.calibrated_hw, ctx.spec_hw, ctx.calibrated
    by_folder: dict[str, list[str]] = {}
    for arm in sorted(study.arms):
        by_folder.setdefault(ctx.model(arm).folder or f"(hub: {study.model.name})", []).append(arm)
    blocks = []
    for folder, arms in sorted(by_folder.items()):
        facts: list[Fact] = []
        error = ""
        model = ctx.model(arms[0])
        try:
            if spec is None or folder.startswith("(hub"):
                error = "no local config.json to describe"
            elif model.shape is None:
                error = str(model.error)
            else:
                facts = _model_facts(model.shape, model.dtype, model.kv_dtype, spec, cal if calibrated else None)
        except ValueError as exc:
            error = str(exc)
        blocks.append(ModelBlock(folder=folder, arms=", ".join(arms), facts=tuple(facts), error=error))
    return tuple(blocks)


def _model_facts(shape: ModelShape, dtype: str, kv: str, spec: Hardware, cal: Hardware | None) -> list[Fact]:
    d = describe(shape, batch=1, context=None, dtype=dtype, kv_dtype=kv, hardware=spec)
    facts = [
        Fact("model", f"{d['name']} ({d['family']})"),
        Fact("parameters", f"{d['params']:,} (active per token {d['active_params']:,})"),
        Fact("weights", f"{fmt.si(d['weight_bytes'], 'B')} at {d['dtype']}"),
        Fact("KV cache per token", f"{d['kv_bytes_per_token']:,} B at kv dtype {d['kv_dtype']}"),
        Fact("bytes read per decode step (batch 1)", fmt.si(d["decode_weight_bytes"], "B")),
        Fact("FLOPs per decode step (batch 1)", fmt.si(d["decode_flops"], "FLOP")),
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


def _workloads(study: Study) -> tuple[WorkloadRow, ...]:
    return tuple(WorkloadRow(name, length_text(w.input_len), length_text(w.output_len), f"{w.prefix_len:,}", str(w.seed))
                 for name, w in sorted(study.workloads.items()))


def _load(study: Study) -> tuple[Fact, ...]:
    load = study.load
    facts = [Fact("closed loop: concurrency" if load.concurrency else f"open loop ({load.arrival}): rate req/s",
                  ", ".join(rung.label for rung in load.ladder)),
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
             else fmt.with_unit(fmt.significant(run.client_ceiling_chunks_per_s), "chunks/s")),
    ]
    if run.wall_s and run.window_s:
        facts.append(Fact("wall time vs measurement windows",
                          f"{fmt.significant(run.wall_s)} s over {fmt.significant(run.window_s)} s of windows "
                          f"({fmt.significant(run.wall_s / run.window_s, 2)}x) on device(s) {run.devices or '-'}"))
    facts += _interference(run.interference_json)
    for s in sorted(servers, key=lambda s: s.server_id):
        cache = f" ({s.compile_cache} compile cache)" if s.compile_cache else ""
        facts.append(Fact(f"server {s.server_id}",
                          f"{s.status or '-'}; start {fmt.quantity(s.startup_s, 's', measured=False)}{cache}; "
                          f"KV capacity {fmt.quantity(s.kv_capacity_tokens, 'tokens', measured=False)}"
                          + (f"; device {s.device}" if s.device else "") + _machine(s)))
    return tuple(facts)


def _machine(server: ServerRecord) -> str:
    """The launch's own calibration of the server's GPU, where one was asked for (machine metrics)."""
    if server.machine_flops is not None and server.machine_bandwidth is not None:
        ridge = server.metric("ridge_point")
        return (f"; calibrated before it started: {fmt.significant(server.machine_bandwidth / 1e12)} TB/s, "
                f"{fmt.significant(server.machine_flops / 1e12)} TFLOP/s bf16, ridge point "
                f"{fmt.significant(ridge or 0.0)} FLOP/byte")
    return f"; {server.calibration_error}" if server.calibration_error else ""


def _interference(text: str | None) -> list[Fact]:
    """The run's interference measurement (one point alone twice, then beside another launch), if any."""
    try:
        found = json.loads(text or "{}")
    except ValueError:
        return []
    if not found:
        return []
    if found.get("effect") is None:
        return [Fact("interference", f"{found.get('why') or 'not measured'}")]
    return [Fact("interference",
                 f"{found.get('point')}: {fmt.percent(found['effect'])} beside {found.get('beside_launch')} "
                 f"vs a noise threshold of {fmt.percent(found.get('threshold'))}; {found.get('why')}")]


def _calibration(ctx: StudyContext) -> tuple[CalibrationRow, ...]:
    spec, calibrated, run = ctx.spec_hw, ctx.calibrated, ctx.run
    if spec is None:
        return ()

    try:
        reason = json.loads((run.calibration_json if run else None) or "{}").get("reason") or ""
    except (ValueError, AttributeError):
        reason = ""
    missing = f"not calibrated: {reason}" if reason else "not calibrated"

    def row(label: str, spec_v: float, measured: float | None, unit: str, scale: float) -> CalibrationRow:
        return CalibrationRow(
            f"{label} ({unit})", f"{fmt.significant(spec_v / scale)} ({spec.name}, {spec.source})",
            missing if not (calibrated and measured) else fmt.significant(measured / scale),
            "-" if not (calibrated and measured) else f"{fmt.percent(measured / spec_v)} of spec",
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

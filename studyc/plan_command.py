"""`studyc plan` as data: a compiled study with the step-time model's predictions, the block planner's
advice and the equivalent `vllm bench serve` commands, each when asked for, and their text.

The command line prints what these functions return.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from compiler.bench_equivalent import DIFFERENCES, bench_command
from compiler.load import LoadedStudy
from compiler.model_freeze import freeze_model_values
from compiler.model_value import MODEL, ModelPoint, ModelValue, uses_model
from compiler.plan import Plan
from compiler.plan_compile import compile_study
from compiler.plan_table import format_plan, markdown_plan
from report.ledger.ledger import PointPrediction
from report.planning.block_planner import PowerRow
from report.planning.decidability import Decidability
from report.planning.design_costs import GpuPlan, format_gpu_plan
from studyc.decide import decidability


@dataclass(frozen=True)
class Advice:
    """The block planner's advice from a database: per hypothesis, the blocks it likely needs."""

    rows: list[PowerRow]
    vllm_version: str | None
    db: Path
    gpu: GpuPlan | None = None  # the cheapest launches x repeats per hypothesis (report.planning.design_costs)


@dataclass(frozen=True)
class PlanSummary:
    """A compiled study (its plan carries the estimate) with what was asked for beside it."""

    plan: Plan
    predicted: dict[str, PointPrediction] | None = None  # point id -> the step-time model's prediction
    advice: Advice | None = None
    bench: dict[str, str] | None = None  # point id -> its `vllm bench serve` command
    decidability: tuple[Decidability, ...] = ()  # per hypothesis, at the priors of `db`, else the defaults


def plan_study(loaded: LoadedStudy, *, db: Path | None = None, bench: bool = False, advise: bool = True,
               say: Callable[[str], None] = lambda _: None) -> PlanSummary:
    """Compile a study; with `db`, predict its points from the runs stored there and (`advise`) ask the
    block planner how many blocks each hypothesis needs; with `bench`, each point's bench command."""
    plan = compile_study(loaded)
    predicted = advice = None
    if db is not None:
        predicted = _predict(plan, db, say)
    plan = freeze_model_values(plan, loaded, model_points(predicted) if predicted is not None else None)
    commands = bench_commands(plan) if bench else None
    decided = tuple(decidability(plan, db))
    if db is not None and advise:
        from report.audit import audit_studies
        from report.planning.block_planner import edge_distance, power_plan
        from report.planning.design_costs import block_costs, gpu_plan
        from report.scoring.score_model import Why

        last = {s.hypothesis: s for s in audit_studies([loaded], [db]).scores if s.run_id is not None}
        distances = {h: d for h, s in last.items()  # a percentile on a cliff: no blocks decide it
                     if not s.has(Why.ON_A_CLIFF) and (d := edge_distance(s)) is not None}
        gpu = gpu_plan(plan, db, distances)
        advice = Advice(*power_plan(plan, db, last, block_costs(gpu, plan.design.repeats)), db, gpu)
    return PlanSummary(plan, predicted, advice, commands, decided)


def compile_with_model(loaded: LoadedStudy, db: Path | None, say: Callable[[str], None] = lambda _: None, *,
                       resume: bool = False) -> Plan:
    """The study's plan, each `value = "model"` prediction frozen in from the step-time model fitted on `db`
    (only read when the study has one; `studyc run` compiles this way). `resume`: the numbers the study's
    latest run froze are kept, so a resumed run is not scored against a model refitted on its own points."""
    plan = compile_study(loaded)
    if not uses_model(loaded.study):
        return plan
    exists = db is not None and db.exists()
    kept = _frozen_before(db, plan.study_id) if resume and db is not None and exists else {}
    wanted = {h.id for h in loaded.study.hypothesis if h.predict.value == MODEL}
    if not wanted <= kept.keys():
        predicted = _predict(plan, db, say) if db is not None and exists else None
        plan = freeze_model_values(plan, loaded, model_points(predicted) if predicted is not None else None)
    return plan.model_copy(update={"hypotheses": tuple(
        h.model_copy(update={"model": kept[h.id]}) if h.id in kept and h.id in wanted else h for h in plan.hypotheses)})


def _frozen_before(db: Path, study_id: str) -> dict[str, ModelValue]:
    """hypothesis id -> the number the study's latest stored run froze into its plan."""
    from runner.store.store import Store

    with Store(db, read_only=True) as store:
        run = store.latest_run(study_id)
    earlier = Plan.from_stored(run.plan_json) if run is not None else None
    return {h.id: h.model for h in earlier.hypotheses if h.model is not None} if earlier is not None else {}


def _predict(plan: Plan, db: Path, say: Callable[[str], None]) -> dict[str, PointPrediction]:
    from report.ledger.ledger import predict_points, read_calibrations
    from studyc.model_command import stored_points

    return predict_points(plan, stored_points(db, say), calibrations=read_calibrations(db))


def model_points(predicted: dict[str, PointPrediction]) -> dict[str, ModelPoint]:
    """The step-time model's predictions as the compiler's typed input (compiler.model_value)."""
    return {pid: ModelPoint(dict(p.values), p.fit_key, p.card, p.note) for pid, p in predicted.items()}


def model_lines(plan: Plan) -> str:
    """The plan's frozen `value = "model"` predictions, one hypothesis a line with its provenance."""
    lines = []
    for h in plan.hypotheses:
        if h.model is not None:
            band = f" ±{100 * h.prediction.band:.3g}%"
            unit = "" if h.denominator else f" {h.unit}"
            lines.append(f"  {h.id}: {h.metric}{' ratio' if h.denominator else ''} = {h.model.value:.4g}{unit}{band}"
                         f"\n    fit: {h.model.fit_key}\n    card: {h.model.card}")
    return "step-time model predictions frozen into the plan:\n" + "\n".join(lines) + "\n" if lines else ""


def bench_commands(plan: Plan) -> dict[str, str]:
    """point id -> the `vllm bench serve` command offering that point's load (a search: its probe at hi)."""
    goodput = plan.slo.bench_goodput() if plan.slo else ""
    return {
        point.id: bench_command(point, base_url="http://127.0.0.1:8000", model=launch.model_dir,
                                served_name=launch.served_model_name, goodput=goodput)
        for launch in plan.launches for point in (*launch.points, *(q.template for q in launch.searches))
    }


def plan_json(summary: PlanSummary) -> str:
    """The plan as JSON; each hypothesis with its `decidability`; each point also with `predicted` and
    `bench_equivalent` when they were asked for."""
    data = json.loads(summary.plan.to_json())  # the plan's own JSON, with its fields left out where it leaves them
    decided = {d.hypothesis: d.to_json() for d in summary.decidability}
    for hyp in data.get("hypotheses", []):
        hyp["decidability"] = decided.get(hyp["id"])
    for launch in data["launches"]:
        for point in launch["points"]:
            if summary.predicted is not None:
                found = summary.predicted.get(point["id"])
                point["predicted"] = found.values if found is not None else None
            if summary.bench is not None:
                point["bench_equivalent"] = summary.bench[point["id"]]
    return json.dumps(data, indent=2)


def plan_text(summary: PlanSummary, markdown: bool = False) -> str:
    """The plan's table (or GitHub markdown), then the predictions, the advice and the bench commands."""
    from report.ledger.ledger_text import prediction_table

    if markdown:
        text = markdown_plan(summary.plan) + "\n" + model_lines(summary.plan)
        if summary.predicted is not None:
            text += "\n" + prediction_table(summary.predicted, markdown=True)
    else:
        text = format_plan(summary.plan) + model_lines(summary.plan)
        if summary.predicted is not None:
            text += "\nstep-time model predictions:\n" + prediction_table(summary.predicted)
    if summary.decidability:
        from report.planning.decidability_text import section

        text += "\n" + section(summary.decidability)
    if summary.advice is not None:
        from report.planning.power_text import format_power

        text += "\n" + format_power(summary.advice.rows, summary.advice.vllm_version, summary.advice.db)
        if summary.advice.gpu is not None:
            text += "\n" + format_gpu_plan(summary.advice.gpu, summary.plan.study_id, summary.advice.db)
    if summary.bench is not None:
        text += "\nthe same load from `vllm bench serve` (start the server with the launch's argv first):\n"
        text += "".join(f"{point_id}:\n  {command}\n" for point_id, command in summary.bench.items())
        text += "what differs:\n" + "\n".join(f"- {line}" for line in DIFFERENCES) + "\n"
    return text

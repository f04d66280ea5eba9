"""One study and its run -> the StudyContext every report stage reads: the Plan the run executed (with its
hypotheses resolved to point and server ids), the model shape and serving dtypes of each arm, and the
calibrated and spec-sheet hardware. Built once per study per build (`build_context`) and handed to
scoring, the study page, its charts and the seed note, so none of them works these out again.

A run stored with a plan that has no resolved hypotheses (plan schema v1, or no readable plan) gets the
study file's hypotheses resolved by the compiler's selectors onto the points the run stored (point ids
are stable); the context says so (`plan_source`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from compiler.hardware import Hardware, HardwareError, get_hardware
from compiler.load import LoadedStudy
from compiler.metrics import METRICS
from compiler.modelconfig import ModelError, load_model
from compiler.modelmath import ModelShape
from compiler.plan import HypothesisSide, HypothesisStep, Plan
from compiler.plan_resolve import hypothesis_side, hypothesis_step
from compiler.predict_resolve import model_folder, serving_dtypes
from compiler.select import Target, sides
from compiler.study import Hypothesis, Study
from report.results import RunData
from report.stats.alpha_ledger import AlphaShare, ledger
from report.stats.intervals import Layout, layout
from runner.store.records import RunRecord

PlanSource = Literal["stored", "recompiled from the study file"]


@dataclass(frozen=True)
class ArmModel:
    """The model an arm serves: its folder, shape and serving dtypes, or why there is no shape."""

    folder: str | None
    shape: ModelShape | None
    dtype: str  # weight dtype served ("" without a shape)
    kv_dtype: str
    error: Exception | None  # ModelError or ValueError from reading the config; None with a shape

    def require(self) -> tuple[ModelShape, str, str]:
        """(shape, dtype, kv dtype); raises the reason there is none."""
        if self.shape is None:
            raise self.error or ModelError("no model shape")
        return self.shape, self.dtype, self.kv_dtype


@dataclass(frozen=True)
class StudyContext:
    loaded: LoadedStudy
    data: RunData | None
    plan: Plan | None  # the run's stored plan, its hypotheses filled in; None: no run or no readable plan
    plan_source: PlanSource
    recompiled: tuple[str, ...]  # hypothesis ids resolved from the study file, not read from the stored plan
    hypotheses: dict[str, HypothesisStep]  # by id; a hypothesis whose selector fails is in `unresolved`
    unresolved: dict[str, str]  # hypothesis id -> why its selector resolves to no side
    models: dict[str, ArmModel]  # by arm; "" is the study's own model (an arm-less expression)
    calibrated_hw: Hardware | None
    spec_hw: Hardware | None
    calibrated: bool
    layout: Layout
    alpha: dict[str, AlphaShare] = field(default_factory=dict)  # hypothesis id -> the run's share (alpha_ledger)

    @property
    def study(self) -> Study:
        return self.loaded.study

    @property
    def run(self) -> RunRecord | None:
        return self.data.run if self.data else None

    def model(self, arm: str) -> ArmModel:
        return self.models.get(arm, self.models[""])


def model_dir(loaded: LoadedStudy, arm: str) -> str | None:
    """The folder of the model an arm serves: arm.model overrides study.model.path."""
    return model_folder(loaded.study, loaded.directory, arm)


def hardware_pair(study: Study, run: RunRecord | None) -> tuple[Hardware | None, Hardware | None, bool]:
    """(calibrated card, spec card, calibrated?): the study's hardware entry, with the run's measured
    bandwidth and matmul rate in place of the sheet's when the run calibrated."""
    try:
        spec = get_hardware(study.study.hardware)
    except HardwareError:
        return None, None, False
    if run and run.calibrated and (run.bandwidth_Bps or run.flops_bf16):
        return spec.calibrated(bandwidth_Bps=run.bandwidth_Bps, flops_bf16=run.flops_bf16), spec, True
    return spec, spec, False


def arm_models(loaded: LoadedStudy) -> dict[str, ArmModel]:
    """Every arm's model (and "" for the study's own), each config read once per folder."""
    study = loaded.study
    shapes: dict[str, ModelShape | Exception] = {}
    out: dict[str, ArmModel] = {}
    for arm in ["", *study.arms]:
        folder = model_dir(loaded, arm)
        if folder is None:
            error = ModelError(f"arm {arm!r} names no local model folder: expressions need a config.json")
            out[arm] = ArmModel(None, None, "", "", error)
            continue
        if folder not in shapes:
            try:
                shapes[folder] = load_model(folder)
            except (ModelError, ValueError) as exc:
                shapes[folder] = exc
        found = shapes[folder]
        if isinstance(found, Exception):
            out[arm] = ArmModel(folder, None, "", "", found)
        else:
            out[arm] = ArmModel(folder, found, *serving_dtypes(study, arm, found), None)
    return out


def resolve_hypothesis(study: Study, hyp: Hypothesis, data: RunData | None, plan: Plan | None) -> HypothesisStep:
    """A hypothesis of the study file resolved onto a run that stored no resolution: the compiler's selectors
    (compiler.select) give each side's arm, workload and rung; its points are the run's stored points
    there (the plan's, else the point records), its servers the arm's stored servers. ValueError: the
    selector does not resolve."""
    metric = METRICS.get(hyp.metric)
    if metric is None:
        raise ValueError(f"unknown metric {hyp.metric!r}")
    top, bottom = sides(study, hyp)
    steps = ([(p.id, p.arm, p.workload, p.concurrency, p.rate_rps) for p in plan.points] if plan is not None else
             [(p.point_id, p.arm, p.workload, p.concurrency, p.rate_rps) for p in data.points] if data is not None
             else [])
    servers = sorted({s.server_id: s.arm for s in data.servers}.items()) if data is not None else []

    def side(target: Target) -> HypothesisSide:
        if metric.level == "search":
            return hypothesis_side(target, [q.id for launch in (plan.launches if plan else ()) for q in launch.searches
                                            if (q.arm, q.workload) == (target.arm, target.workload)])
        points = () if metric.level == "server" else tuple(
            i for i, arm, workload, concurrency, rate_rps in steps
            if (arm, workload, concurrency, rate_rps) == (target.arm, target.workload, target.concurrency,
                                                          target.rate_rps))
        return hypothesis_side(target, points,
                               servers=[i for i, arm in servers if arm == target.arm])

    return hypothesis_step(hyp, side(top), side(bottom) if bottom is not None else None)


def side_label(side: HypothesisSide) -> str:
    """arm[/workload][/concurrency or rate], as compiler.select.Target labels it."""
    return Target(side.arm, side.workload, side.concurrency, side.rate_rps).label


def build_context(loaded: LoadedStudy, data: RunData | None) -> StudyContext:
    """The study's context against one run (None: not run)."""
    study = loaded.study
    plan = data.plan if data else None
    stored = {h.id: h for h in plan.hypotheses} if plan is not None else {}
    hypotheses: dict[str, HypothesisStep] = {}
    unresolved: dict[str, str] = {}
    recompiled: list[str] = []
    for hyp in study.hypothesis:
        if hyp.id in stored:
            hypotheses[hyp.id] = stored[hyp.id]
            continue
        recompiled.append(hyp.id)
        try:
            hypotheses[hyp.id] = resolve_hypothesis(study, hyp, data, plan)
        except ValueError as exc:
            unresolved[hyp.id] = str(exc)
    if plan is not None and recompiled:
        plan = plan.model_copy(update={"hypotheses": tuple(hypotheses.values())})
    cal, spec, calibrated = hardware_pair(study, data.run if data else None)
    return StudyContext(
        loaded=loaded, data=data, plan=plan,
        plan_source="recompiled from the study file" if recompiled else "stored",
        recompiled=tuple(recompiled), hypotheses=hypotheses, unresolved=unresolved, models=arm_models(loaded),
        calibrated_hw=cal, spec_hw=spec, calibrated=calibrated,
        layout=layout(plan),
        alpha=ledger(data.study_runs, data.run_id) if data and data.study_runs else {},
    )

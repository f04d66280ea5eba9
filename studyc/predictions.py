"""The step-time model's prediction for each point of a run: what `studyc run` hands the runner.

The runner never imports the report: it asks `RunOptions.predict` (this module's `predict_run`) once
the run is open, and stores each point's prediction beside its measurement.
"""

from __future__ import annotations

from compiler.plan import Plan
from report.ledger.ledger import PointPrediction, predict_points, store_calibrations, store_points
from runner.execute.driver import Progress
from runner.store.records import RunRecord
from runner.store.store import Store


def predict_run(store: Store, plan: Plan, run: RunRecord, progress: Progress) -> dict[str, PointPrediction]:
    """The step-time model's prediction for every point, fitted from the other runs in this database (every
    GPU's points; this run's own points never fit it) and priced on the host's GPU: its calibrations stored
    by earlier runs, else its spec sheet scaled (this run's GPU is calibrated later, at each launch). Where
    it cannot predict, each point says why."""
    if not run.gpu_name:
        note = "no GPU on this host (NVML found none): the step-time model prices a GPU's card"
        return {p.id: PointPrediction.none(note) for p in plan.points}
    points = [p for p in store_points(store) if p.run_id != run.run_id]
    progress.message(f"fitting the step-time model from {len({p.run_id for p in points})} run(s)")
    try:
        return predict_points(plan, points, hardware=run.gpu_name, calibrations=store_calibrations(store))
    except ValueError as exc:
        note = f"the step-time model could not be fitted: {exc}"
        return {p.id: PointPrediction.none(note) for p in plan.points}

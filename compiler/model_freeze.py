"""Freezing `value = "model"` predictions into a compiled plan (compiler.model_value): the step-time model's
per-point predictions, computed by the caller from a database, become each such hypothesis' number.
"""

from __future__ import annotations

from collections.abc import Mapping

from base.errors import StudycError
from compiler.load import LoadedStudy
from compiler.model_value import MODEL, MODEL_METRICS, ModelPoint, ModelValue
from compiler.plan import Plan


def freeze_model_values(plan: Plan, loaded: LoadedStudy, points: Mapping[str, ModelPoint] | None) -> Plan:
    """The plan with each `value = "model"` hypothesis' number frozen in (`HypothesisStep.model`), from the
    model's predictions of its points (`points`: point id -> prediction; None: no database was given). A
    hypothesis the model cannot predict fails the compile: StudycError naming file, line and key."""
    steps = {h.id: h for h in plan.hypotheses}
    frozen = {}
    for index, hyp in enumerate(loaded.study.hypothesis):
        if hyp.predict.value != MODEL or hyp.id not in steps:
            continue
        key = f"hypothesis[{index}].predict.value"
        where = f"{loaded.path}:{loaded.line(key)}: {key}"
        if points is None:
            raise StudycError(f'{where}: value = "model" is the step-time model\'s prediction, fitted from stored '
                              "runs: give --db DB")
        step = steps[hyp.id]
        metric = MODEL_METRICS.get(hyp.metric)
        if metric is None:
            raise StudycError(f'{where}: value = "model" cannot predict {hyp.metric}')
        means: list[float] = []
        first: ModelPoint | None = None
        for side in (step.numerator, step.denominator):
            if side is None:
                continue
            values = []
            for pid in side.points:
                got = points.get(pid)
                value = got.values.get(metric) if got is not None else None
                if got is None or value is None:
                    why = got.note if got is not None and got.note else "no prediction"
                    raise StudycError(f"{where}: the step-time model does not predict {pid}: {why}")
                first = first or got
                values.append(value)
            if not values:
                raise StudycError(f"{where}: the hypothesis rests on no point the step-time model predicts")
            means.append(sum(values) / len(values))
        if len(means) == 2 and means[1] == 0:
            raise StudycError(f"{where}: the step-time model predicts 0 for the ratio's denominator")
        assert first is not None
        value = means[0] / means[1] if len(means) == 2 else means[0]
        frozen[hyp.id] = step.model_copy(update={"model": ModelValue(value=value, fit_key=first.fit_key,
                                                                     card=first.card)})
    if not frozen:
        return plan
    return plan.model_copy(update={"hypotheses": tuple(frozen.get(h.id, h) for h in plan.hypotheses)})

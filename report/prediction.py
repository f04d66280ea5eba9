"""A hypothesis' prediction as numbers: its central value and band, resolved on one card (the run's
calibrated ceilings or the spec sheet) with the arm's model.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from compiler.expr import parse
from compiler.hardware import Hardware, HardwareError
from compiler.load import LoadedStudy
from compiler.predict_env import build_env
from compiler.study import Hypothesis
from report.context import ArmModel, arm_models


@dataclass(frozen=True)
class Resolved:
    """A prediction as numbers: the central value and the band a measurement must fall in."""

    predicted: float | None
    band_low: float | None
    band_high: float | None


def _evaluate(value: float | str, env: Callable[[], dict[str, Any]]) -> float:
    if isinstance(value, int | float):
        return float(value)
    return parse(value).evaluate(env())


def resolve_prediction(
    loaded: LoadedStudy, hyp: Hypothesis, arm: str, hw: Hardware | None, models: dict[str, ArmModel] | None = None
) -> Resolved:
    """Numbers of a prediction on one card, with the arm's model (from the study context; read from the
    study file when none is given). Raises ExprError/ModelError/ValueError when it cannot."""
    models = models if models is not None else arm_models(loaded)
    model = models.get(arm, models[""])

    def env() -> dict[str, Any]:
        if model.folder is None:
            model.require()
        if hw is None:
            raise HardwareError(f"unknown hardware {loaded.study.study.hardware!r}")
        shape, dtype, kv = model.require()
        return build_env(shape, hw, dtype=dtype, kv_dtype=kv)

    p = hyp.predict
    if p.kind == "range":
        assert p.range is not None
        low, high = sorted((_evaluate(p.range[0], env), _evaluate(p.range[1], env)))
        return Resolved((low + high) / 2, low, high)
    assert p.value is not None
    value = _evaluate(p.value, env)
    if p.kind == "relation":
        if p.relation in (">", ">="):
            return Resolved(value, value, None)
        return Resolved(value, None, value)
    low, high = sorted((value * (1 - p.band), value * (1 + p.band)))
    return Resolved(value, low, high)

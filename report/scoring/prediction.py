"""A hypothesis' prediction as numbers: its central value and band, resolved on one card (the run's
calibrated ceilings or the spec sheet) with the arm's model, the way the compiler checked that it
evaluates (compiler.predict_resolve).
"""

from __future__ import annotations

from typing import Any

from compiler.hardware import Hardware, HardwareError
from compiler.load import LoadedStudy
from compiler.predict_env import build_env
from compiler.predict_resolve import Resolved, resolve_band
from compiler.study import Hypothesis
from report.scoring.context import ArmModel, arm_models

__all__ = ["Resolved", "resolve_prediction"]


def resolve_prediction(
    loaded: LoadedStudy, hyp: Hypothesis, arm: str, hw: Hardware | None, models: dict[str, ArmModel] | None = None,
    frozen: float | None = None,
) -> Resolved:
    """Numbers of a prediction on one card, with the arm's model (from the study context; read from the
    study file when none is given); `frozen`: the plan's number for `value = "model"` (the same on every
    card: it was priced on the target GPU when the plan was compiled). Raises ExprError/ModelError/ValueError
    when it cannot."""
    models = models if models is not None else arm_models(loaded)
    model = models.get(arm, models[""])

    def env() -> dict[str, Any]:
        if model.folder is None:
            model.require()
        if hw is None:
            raise HardwareError(f"unknown hardware {loaded.study.study.hardware!r}")
        shape, dtype, kv = model.require()
        return build_env(shape, hw, dtype=dtype, kv_dtype=kv)

    return resolve_band(hyp.predict, env, frozen)

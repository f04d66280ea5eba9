"""A prediction as numbers (its central value and band), and the compile-time check that every prediction
of a study evaluates: against the spec-sheet card with each arm's model config, so that a prediction that
cannot be evaluated is an error at `studyc validate` and `studyc plan`, never a verdict left open.
Scoring resolves the same way (report.scoring.prediction), on the run's calibrated card and on the spec sheet.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from compiler.expr import ExprError, parse
from compiler.hardware import Hardware, HardwareError, get_hardware
from compiler.model_value import MODEL
from compiler.modelconfig import ModelError, load_model
from compiler.modelmath import ModelShape
from compiler.predict_env import build_env, env_names
from compiler.select import sides
from compiler.study import Hypothesis, Prediction, Study

Finding = tuple[str, str]  # (dotted key, message)
Env = Callable[[], dict[str, Any]]


@dataclass(frozen=True)
class Resolved:
    """A prediction as numbers: the central value and the band a measurement must fall in."""

    predicted: float | None
    band_low: float | None
    band_high: float | None


def _number(value: float | str, env: Env) -> float:
    if isinstance(value, str):
        return parse(value).evaluate(env())
    if not math.isfinite(value):
        raise ExprError(f"{value!r} is not a finite number")
    return float(value)


def resolve_band(p: Prediction, env: Env, frozen: float | None = None) -> Resolved:
    """The prediction's value and band; `env` is called only for an expression; `frozen`: the number the plan
    froze for `value = "model"` (compiler.model_value). Raises ExprError (and whatever `env` raises:
    ModelError, HardwareError, ValueError) when it cannot be evaluated."""
    if p.value == MODEL:
        if frozen is None:
            raise ValueError('value = "model": the run\'s plan holds no frozen step-time model prediction '
                             "(it is frozen when the study is compiled with --db)")
        low, high = sorted((frozen * (1 - p.band), frozen * (1 + p.band)))
        return Resolved(frozen, low, high)
    if p.kind == "range":
        assert p.range is not None
        low, high = sorted((_number(p.range[0], env), _number(p.range[1], env)))
        return Resolved((low + high) / 2, low, high)
    assert p.value is not None
    value = _number(p.value, env)
    if p.kind == "relation":
        if p.relation in (">", ">="):
            return Resolved(value, value, None)
        return Resolved(value, None, value)
    low, high = sorted((value * (1 - p.band), value * (1 + p.band)))
    return Resolved(value, low, high)


def model_folder(study: Study, directory: Path | str, arm: str) -> str | None:
    """The folder of the model an arm serves ("" : the study's own): arm.model overrides study.model.path."""
    rel = study.arms[arm].model if arm in study.arms else None
    rel = rel or study.model.path
    return os.path.normpath(os.path.join(directory, rel)) if rel else None


def serving_dtypes(study: Study, arm: str, shape: ModelShape) -> tuple[str, str]:
    """(weight dtype, KV dtype) the arm's server runs with; `auto` weights follow the checkpoint,
    served in 16-bit when it is fp32 (vLLM's default)."""
    dtype = study.model.dtype
    if dtype == "auto":
        dtype = "bf16" if shape.dtype == "fp32" else shape.dtype
    options = {**study.engine, **(study.arms[arm].args if arm in study.arms else {})}
    kv = str(options.get("kv_cache_dtype", options.get("kv-cache-dtype", "auto")))
    return dtype, kv


def _expressions(p: Prediction) -> list[tuple[str, float | str]]:
    items: list[tuple[str, float | str]] = [("value", p.value)] if p.value not in (None, MODEL) else []
    return items + [(f"range[{i}]", b) for i, b in enumerate(p.range or ())]


def _well_formed(item: float | str) -> bool:
    """Whether the syntax and name checks (compiler.validate) pass it: only those are evaluated here."""
    if not isinstance(item, str):
        return True
    try:
        return parse(item).names <= env_names()
    except ExprError:
        return False


def check_predictions(study: Study, directory: Path) -> Iterator[Finding]:
    """Every prediction evaluates on the spec-sheet card with its arm's model (the numerator's, as scoring
    reads it). `model.calibrated.*` needs coefficients fitted from stored runs, which the compiler does not
    read: the roofline stands in for it here, since the expression only has to evaluate."""
    hw: Hardware | None = None
    try:
        hw = get_hardware(study.study.hardware)
    except HardwareError:
        pass  # reported by the hardware check; a number still has to be finite
    for index, hyp in enumerate(study.hypothesis):
        items = _expressions(hyp.predict)
        if not all(_well_formed(item) for _, item in items):
            continue  # the syntax and name checks report it
        env = _compile_env(study, directory, _arm(study, hyp), hw)
        for name, item in items:
            if hw is None and isinstance(item, str):
                continue  # the hardware check reports the unknown card
            try:
                _number(item, env)
            except (ExprError, ModelError, HardwareError, ValueError) as exc:
                yield (f"hypothesis[{index}].predict.{name}",
                       f"the prediction cannot be evaluated on the spec sheet ({study.study.hardware}): {exc}")


def _arm(study: Study, hyp: Hypothesis) -> str:
    try:
        return sides(study, hyp)[0].arm
    except (ValueError, KeyError):  # KeyError: an unknown metric
        return ""  # the selector and metric checks report it; scoring then reads the study's own model


def _compile_env(study: Study, directory: Path, arm: str, hw: Hardware | None) -> Env:
    def env() -> dict[str, Any]:
        assert hw is not None
        folder = model_folder(study, directory, arm)
        if folder is None:
            raise ModelError(f"arm {arm!r} names no local model folder: expressions need a config.json")
        shape = load_model(folder)
        dtype, kv = serving_dtypes(study, arm, shape)
        names = build_env(shape, hw, dtype=dtype, kv_dtype=kv)
        names["model.calibrated.decode_step_s"] = names["roofline.decode_step_s"]
        names["model.calibrated.decode_tokens_per_s"] = names["roofline.decode_tokens_per_s"]
        return names
    return env

"""`predict = { value = "model" }`: a hypothesis predicted by the calibrated step-time model, its number
frozen into the plan at compile time (before the run), so a study can test the model itself. The compiler
stays pure: the model's per-point predictions are computed from a database by the caller (studyc.plan_command,
through report.ledger.ledger.predict_points) and handed over as `ModelPoint`s to compiler.model_freeze.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from compiler.study import Study

MODEL = "model"
# A hypothesis' metric -> the step-time model's metric of the same quantity (report.ledger.ledger_fit.METRICS).
MODEL_METRICS = {"output_throughput": "output_throughput", "tpot_mean_s": "tpot_s", "ttft_mean_s": "ttft_s"}
Finding = tuple[str, str]  # (dotted key, message)


@dataclass(frozen=True)
class ModelPoint:
    """The step-time model's prediction for one plan point, as the caller computed it from a database."""

    values: Mapping[str, float | None]  # model metric (MODEL_METRICS' values) -> predicted; None: not predicted
    fit_key: str = ""  # the fit the numbers come from, with the GPUs it was fitted on
    card: str = ""  # the card the fit is priced on, and how that card was found
    note: str = ""  # why there is no prediction (or what is unusual about it)


class ModelValue(BaseModel):
    """A `value = "model"` prediction frozen into the plan: the number and where it came from."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    value: float = Field(description="The step-time model's prediction of the hypothesis' measured quantity "
                         "(the mean of its points' predictions; numerator / denominator for a ratio).")
    fit_key: str = Field(description="The fit it comes from: vLLM version, model family, engine options and "
                         "the GPUs whose points were fitted.")
    card: str = Field(description="The GPU card the fit was priced on and how it was found (compiler.target_card).")


def uses_model(study: Study) -> bool:
    """Whether any hypothesis is predicted by the step-time model (its plan needs the model's numbers)."""
    return any(h.predict.value == MODEL for h in study.hypothesis)


def check_model_values(study: Study) -> Iterator[Finding]:
    """A `value = "model"` hypothesis names a metric the model predicts and states its own tolerance: the
    default 5% is about the model's median error on throughput and TPOT (docs/predictions.md), so half the
    points would miss it; its TTFT error is about 27%."""
    for index, hyp in enumerate(study.hypothesis):
        p = hyp.predict
        if p.value != MODEL:
            continue
        base = f"hypothesis[{index}]"
        if hyp.metric not in MODEL_METRICS:
            yield f"{base}.metric", (f'value = "model" predicts {", ".join(MODEL_METRICS)} (the step-time '
                                     f"model's metrics), not {hyp.metric}")
        if p.relation is not None:
            yield f"{base}.predict.relation", 'value = "model" takes a `tolerance`, not a `relation`'
        elif p.tolerance is None:
            yield f"{base}.predict.tolerance", ('value = "model" needs a stated `tolerance`: the model\'s own '
                                                "error (ledger medians: about 4% for throughput and TPOT, 27% for "
                                                "TTFT; docs/predictions.md), e.g. tolerance = 0.1")

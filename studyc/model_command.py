"""`studyc model` as data: a model's facts from its config.json, or the step-time model fitted from a database.

The command line prints what these functions return; the tables are in `report.ledger.ledger_text` and
`facts_text` here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from base.errors import SpecError
from report.ledger import ledger_fit, ledger_text
from report.ledger.ledger import read_ledger
from report.ledger.ledger_fit import StoredPoint


def model_facts(path: Path, *, batch: int, context: int | None, kv_dtype: str, hardware: str) -> dict[str, Any]:
    """Parameters, weight and KV bytes and the decode roofline of the model in `path` on `hardware`."""
    from compiler.hardware import HardwareError, get_hardware
    from compiler.modelconfig import ModelError, load_model
    from compiler.modelmath import describe

    try:
        return describe(load_model(path), batch=batch, context=context, kv_dtype=kv_dtype,
                        hardware=get_hardware(hardware))
    except (ModelError, HardwareError) as exc:
        raise SpecError(str(exc)) from None


def facts_text(facts: dict[str, Any], markdown: bool = False) -> str:
    """The facts as two aligned columns, or a GitHub table."""

    def cell(value: object) -> str:
        return f"{value:,.6g}" if isinstance(value, float) else (f"{value:,}" if isinstance(value, int) else str(value))

    if markdown:
        return "| quantity | value |\n|---|---:|\n" + "".join(f"| {k} | {cell(v)} |\n" for k, v in facts.items())
    width = max(len(k) for k in facts)
    return "".join(f"{key:<{width}}  {cell(value)}\n" for key, value in facts.items())


def stored_points(db: Path, say: Callable[[str], None]) -> list[StoredPoint]:
    """Every stored point the step-time model fits from, saying how many runs they come from."""
    return _read(db, say)[0]


def _read(db: Path, say: Callable[[str], None]) -> tuple[list[StoredPoint], list[dict[str, Any]]]:
    points, unreplayed = read_ledger(db)
    say(f"fitting the step-time model from {len({p.run_id for p in points})} run(s) in {db}")
    return points, unreplayed


@dataclass(frozen=True)
class StepModel:
    """The step-time model of a database: its coefficients per key (`gaps` None), or with the ledger,
    the leave-one-study-out error by study (`rows`) and the studies it could not validate (`gaps`)."""

    rows: list[dict[str, Any]]
    gaps: list[dict[str, Any]] | None = None
    gpus: list[dict[str, Any]] | None = None  # with the ledger: each GPU's error per metric over every study

    def to_json(self) -> list[dict[str, Any]] | dict[str, Any]:
        """The coefficients' rows; with the ledger, its rows by study, by GPU and the points not validated."""
        if self.gaps is None:
            return self.rows
        return {"studies": self.rows, "gpus": self.gpus or [], "not_validated": self.gaps}


def step_model(db: Path, *, ledger: bool, say: Callable[[str], None]) -> StepModel:
    """The fitted coefficients, or with `ledger`, the leave-one-study-out ledger, of the runs in `db`."""
    points, unreplayed = _read(db, say)
    if not ledger:
        return StepModel(ledger_text.model_rows(points))
    scored = ledger_fit.leave_one_study_out(points)
    return StepModel(ledger_fit.ledger(scored), ledger_fit.not_validated(scored) + unreplayed,
                     ledger_fit.gpu_ledger(scored))


def step_model_text(model: StepModel, markdown: bool = False) -> str:
    if model.gaps is None:
        return ledger_text.format_models(model.rows, markdown=markdown)
    return ledger_text.format_ledger(model.rows, model.gaps, markdown=markdown, gpus=model.gpus or ())

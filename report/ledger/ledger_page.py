"""The site's step-time model page: the model's leave-one-study-out error by study, GPU and vLLM version
(median absolute percentage error and the worst point), and the points it could not validate."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jinja2 import Environment

from base import format as fmt
from report.ledger import ledger, ledger_fit

METRIC_LABELS = {"output_throughput": "output throughput", "tpot_s": "TPOT", "ttft_s": "TTFT"}


@dataclass(frozen=True)
class LedgerTable:
    gpu: str
    vllm_version: str
    rows: tuple[dict[str, Any], ...]


@dataclass(frozen=True)
class LedgerPage:
    title: str
    built: str
    runs: int
    tables: tuple[LedgerTable, ...]
    not_validated: tuple[dict[str, Any], ...]
    root: str = ""  # the path from the page to the site's top folder


def ledger_page(dbs: Sequence[Path]) -> LedgerPage:
    """Fit and score the model leave-one-study-out on every calibrated run in the databases."""
    read = [ledger.read_ledger(db) for db in dbs]
    points = [p for pts, _ in read for p in pts]
    scored = ledger_fit.leave_one_study_out(points) if points else []
    rows = ledger_fit.ledger(scored)
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in rows:
        worst = r["worst_point"]
        groups.setdefault((r["gpu"], r["vllm_version"]), []).append({
            **r, "metric_label": METRIC_LABELS.get(r["metric"], r["metric"]),
            "predicted": _value(r["metric"], worst["predicted"]), "measured": _value(r["metric"], worst["measured"]),
        })
    tables = tuple(LedgerTable(gpu, vllm, tuple(rs)) for (gpu, vllm), rs in sorted(groups.items()))
    return LedgerPage("Step-time model: error by study", _as_of(dbs, {p.run_id for p in points}),
                      len({p.run_id for p in points}), tables,
                      tuple(ledger_fit.not_validated(scored) + [g for _, gaps in read for g in gaps]))


def _as_of(dbs: Sequence[Path], run_ids: set[str]) -> str:
    """The data's own date, not the build clock (a rebuild from the same databases is byte-identical):
    "as of" the newest run start among the runs the page rests on."""
    from runner.store.store import Store

    starts = []
    for db in dbs:
        with Store(db, read_only=True) as store:
            starts += [r.started_at for r in store.runs() if r.run_id in run_ids and r.started_at is not None]
    return f"runs up to {max(starts).strftime('%Y-%m-%d %H:%M UTC')}" if starts else "no runs"


def _value(metric: str, value: float | None) -> str:
    return fmt.quantity(value, "tok/s" if metric == "output_throughput" else "ms", measured=False)


def write_page(dbs: Sequence[Path], out: Path, env: Environment) -> Path:
    """Write `ledger.html` into the site folder `out`."""
    path = out / "ledger.html"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(env.get_template("ledger.html").render(page=ledger_page(dbs)), encoding="utf-8")
    return path

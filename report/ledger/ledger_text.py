"""The step-time model's command-line tables: predictions for a plan, the fitted coefficients, the ledger."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from base import format as fmt
from report.ledger.ledger import PointPrediction
from report.ledger.ledger_fit import StoredPoint, fit_key, fit_keys


def _predicted(value: float | None, unit: str) -> str:
    """A predicted number in display unit `unit` (the column names it), through the one formatter."""
    return fmt.NOTHING if value is None else fmt.digits(value, unit, measured=False)


def prediction_rows(predicted: dict[str, PointPrediction]) -> list[tuple[str, str, str, str, str]]:
    """(point, tok/s, TPOT ms, TTFT ms, note) for each predicted point, as text."""
    return [(pid, _predicted(pp.values["output_throughput"], "tok/s"), _predicted(pp.values["tpot_s"], "ms"),
             _predicted(pp.values["ttft_s"], "ms"), pp.note) for pid, pp in predicted.items()]


def prediction_table(predicted: dict[str, PointPrediction], markdown: bool = False) -> str:
    """The predictions of a plan's points: aligned columns, the note unpadded at the end, or a GitHub table."""
    if markdown:
        head = "| point | predicted output tok/s | TPOT ms | TTFT ms | note |\n|---|---:|---:|---:|---|\n"
        return head + "".join("| " + " | ".join(row) + " |\n" for row in prediction_rows(predicted))
    rows = [("point", "predicted tok/s", "TPOT ms", "TTFT ms", "note"), *prediction_rows(predicted)]
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = []
    for r in rows:
        cells = [c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r[:4], widths, strict=True))]
        lines.append("  ".join(cells) + ("  " + r[4] if r[4] else "") + "\n")
    return "".join(lines)


def model_rows(points: Sequence[StoredPoint]) -> list[dict[str, Any]]:
    """The fitted coefficients of every key the points cover, with the points and runs behind them."""
    from compiler.stepcost import coefficients_dict

    rows = []
    for key, coef in fit_keys(replace(p, key=fit_key(p.key)) for p in points).items():
        used = [p for p in points if fit_key(p.key) == key]
        gpus = ", ".join(sorted({p.key.gpu for p in used}))  # fitted on all of them, each on its own card
        rows.append({"gpu": gpus, "vllm_version": key.vllm_version, "family": key.family,
                     "enforce_eager": key.enforce_eager, "kv_cache_dtype": key.kv_cache_dtype,
                     "points": len(used), "runs": len({p.run_id for p in used}),
                     "coefficients": {k: float(f"{v:.4g}") for k, v in coefficients_dict(coef).items()}})
    return rows


def format_models(rows: Sequence[dict[str, Any]], markdown: bool = False) -> str:
    units = {"step_s": ("step ms", 1e3), "seq_s": ("seq us", 1e6), "mem": ("mem", 1.0), "flop": ("flop", 1.0),
             "request_s": ("request ms", 1e3), "admit_s": ("admit ms", 1e3), "overlap": ("overlap p", 1.0)}
    head = ["key", "points", *(label for label, _ in units.values())]
    body = []
    for r in rows:
        mode = "eager" if r["enforce_eager"] else "graphs"
        label = f"{r['gpu']} / vLLM {r['vllm_version']} / {r['family']} / {mode} / kv {r['kv_cache_dtype']}"
        body.append([label, str(r["points"]),
                     *(f"{r['coefficients'][k] * scale:.3g}" for k, (_, scale) in units.items())])
    return _table(head, body, markdown)


def format_ledger(rows: Sequence[dict[str, Any]], gaps: Sequence[dict[str, Any]], markdown: bool = False,
                  gpus: Sequence[dict[str, Any]] = ()) -> str:
    """The ledger by study (each row's points near saturation counted), then by GPU and metric over every
    study (the medians of the points near saturation and of the rest apart), then what was not validated."""
    head = ["study", "gpu", "vLLM", "metric", "n", "near sat.", "median |error| %", "worst point", "error %", "why"]
    body = [[r["study"], r["gpu"], r["vllm_version"], r["metric"], str(r["n"]), str(r.get("saturated", 0)),
             f"{r['median_abs_pct_error']:.2f}", r["worst_point"]["point_id"], f"{r['worst_point']['error_pct']:+.1f}",
             _why(r["worst_point"])] for r in rows]
    text = _table(head, body, markdown)
    if gpus:
        text += "\nby GPU and metric, every validated point:\n" + format_gpu_ledger(gpus, markdown)
    if gaps:
        text += "\nnot validated or not replayed (never in the medians):\n"
        text += "".join(f"  {g['study']}: {g['n']} point(s): {g['reason']}\n" for g in gaps)
    return text


def format_gpu_ledger(rows: Sequence[dict[str, Any]], markdown: bool = False) -> str:
    """Each GPU's error per metric over every study: all points, those near saturation, the rest."""
    head = ["gpu", "metric", "n", "studies", "median |error| %", "near sat. n", "median % near sat.", "median % rest",
            "worst point", "error %"]
    body = [[r["gpu"], r["metric"], str(r["n"]), str(r["studies"]), _pct(r["median_abs_pct_error"]), str(r["saturated"]),
             _pct(r["median_abs_pct_error_saturated"]), _pct(r["median_abs_pct_error_unsaturated"]),
             r["worst_point"]["point_id"], f"{r['worst_point']['error_pct']:+.1f}"] for r in rows]
    return _table(head, body, markdown) + f"near saturation: {SATURATION_RULE}\n"


SATURATION_RULE = ("the point's concurrency at or above the engine's max_num_seqs, a preemption in its window, or "
                   "its KV demand (slots x (longest prompt + output)) at 90% or more of the server's KV capacity")


def _pct(value: float | None) -> str:
    return fmt.NOTHING if value is None else f"{value:.2f}"


def _why(worst: dict[str, Any]) -> str:
    return worst["why"] + (f" [near saturation: {worst['saturated']}]" if worst.get("saturated") else "")


def _table(head: Sequence[str], body: Sequence[Sequence[str]], markdown: bool) -> str:
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(row) + " |" for row in body]
        return "\n".join(lines) + "\n"
    widths = [max(len(str(r[i])) for r in [head, *body]) for i in range(len(head))]
    return "".join("  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() + "\n"
                   for r in [head, *body])

"""The step-time model's ledger: fit its coefficients from stored runs, validate it leave-one-study-out,
and tabulate its error by study, GPU, vLLM version and metric.

Reads the results database directly with duckdb for now; this read belongs in `runner.store` (the one
module that owns DuckDB) once its typed read API settles.
"""

from __future__ import annotations

import json
import re
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from compiler.modelmath import ModelShape, load_model
from compiler.stepmodel import (
    Card,
    Coefficients,
    EngineShape,
    Load,
    ModelKey,
    Observation,
    Prediction,
    cache_hit_tokens,
    fit,
    predict,
)

REPO = Path(__file__).resolve().parents[1]
METRICS = ("output_throughput", "tpot_s", "ttft_s")


@dataclass(frozen=True)
class StoredPoint:
    """One measured point of a stored run, with what the model needs to predict it."""

    study: str
    run_id: str
    point_id: str
    arm: str
    workload: str
    concurrency: int
    key: ModelKey
    model: str  # the model folder's name: a shape no training point has is an extrapolation
    shape: ModelShape
    load: Load
    engine: EngineShape
    card: Card
    measured: dict[str, float | None]  # METRICS, plus window_s and burst_s

    @property
    def observation(self) -> Observation:
        m = self.measured
        return Observation(self.shape, self.load, self.engine, self.card, m["tpot_s"], m["ttft_s"],
                           m["window_s"], m["burst_s"])

    @property
    def config(self) -> str:
        """The point's plan position without its repeat: repeats of one config share a prediction."""
        return self.point_id.rsplit("/", 1)[0]


@dataclass(frozen=True)
class Scored:
    """A held-out point and its prediction. `validated` is False where no other study covers the
    point's key or model, and `reason` says why; such points never enter the ledger's medians."""

    point: StoredPoint
    prediction: Prediction | None
    validated: bool
    reason: str

    def error_pct(self, metric: str) -> float | None:
        measured = self.point.measured.get(metric)
        if self.prediction is None or measured is None or not measured > 0:
            return None
        predicted = getattr(self.prediction, metric)
        return None if predicted is None else 100.0 * (predicted - measured) / measured


# ---- reading ----------------------------------------------------------------------------------
def _gpu_label(name: str | None) -> str:
    return (name or "unknown").removeprefix("NVIDIA ").strip()


def _model_dir(model_dir: str, root: Path) -> Path:
    p = Path(model_dir)
    return p if p.is_absolute() else root / p


def _cached_tokens(points: Sequence[dict[str, Any]]) -> dict[str, tuple[int, ...]]:
    """Prefix-cache hits per request of each point of one server, in plan order: a kept cache holds
    every prompt an earlier point sent (same seed, length and index); a reset one holds none."""
    seen: set[tuple[int, int, int, int, int]] = set()
    prefix_warm = False
    out: dict[str, tuple[int, ...]] = {}
    for p in points:
        if p["cache"] != "keep":
            seen.clear()
            prefix_warm = False
        hits = []
        for i in range(p["requests"]):
            prompt = (p["prompt_seed"], p["input_len"], p["vocab_lo"], p["vocab_hi"], i)
            shared = cache_hit_tokens(p["prefix_len"] + 1) if p.get("prefix_len") and prefix_warm else 0
            hits.append(cache_hit_tokens(p["input_len"]) if prompt in seen else shared)
            prefix_warm = True
        seen.update((p["prompt_seed"], p["input_len"], p["vocab_lo"], p["vocab_hi"], i)
                    for i in range(p["requests"]))
        out[p["id"]] = tuple(hits)
    return out


def plan_loads(plan: dict[str, Any], root: Path = REPO) -> dict[str, tuple[EngineShape, ModelShape, Load]]:
    """Every closed-loop point of a plan (as stored JSON): its engine, model shape and load."""
    out: dict[str, tuple[EngineShape, ModelShape, Load]] = {}
    shapes: dict[str, ModelShape] = {}
    for server in plan["servers"]:
        engine = EngineShape.from_argv(server["argv"], server.get("kv_cache_dtype", "auto"))
        model_dir = server["model_dir"]
        if model_dir not in shapes:
            shapes[model_dir] = load_model(_model_dir(model_dir, root))
        cached = _cached_tokens(server["points"])
        for p in server["points"]:
            if p.get("concurrency") is None:
                continue  # open-loop rate points are not replayed yet
            load = Load(p["concurrency"], p["requests"], p["input_len"], p["output_len"], cached[p["id"]])
            out[p["id"]] = (engine, shapes[model_dir], load)
    return out


def read_points(db: str | Path, root: Path = REPO) -> list[StoredPoint]:
    """Every valid, complete point of every calibrated run in `db`, replayed."""
    import duckdb  # to move into runner.store with its typed reads

    con = duckdb.connect(str(db), read_only=True)
    try:
        runs = con.execute(
            "SELECT run_id, study_id, plan_json, vllm_version, gpu_name, bandwidth_Bps, flops_bf16 FROM runs "
            "WHERE calibrated AND bandwidth_Bps > 0 AND flops_bf16 > 0 ORDER BY run_id"
        ).fetchall()
        rows = con.execute(
            "SELECT run_id, point_id, arm, workload, tpot_mean_s, ttft_mean_s, window_s, output_throughput "
            "FROM points WHERE status = 'ok' AND valid ORDER BY run_id, point_id"
        ).fetchall()
        bursts = _bursts(con)
    finally:
        con.close()
    by_run: dict[str, list[tuple[Any, ...]]] = defaultdict(list)
    for r in rows:
        by_run[r[0]].append(r)
    out: list[StoredPoint] = []
    for run_id, study, plan_json, vllm, gpu, bandwidth, flops in runs:
        plan = json.loads(plan_json)
        loads = plan_loads(plan, root)
        card = Card(float(bandwidth), float(flops))
        for _, point_id, arm, workload, tpot, ttft, window, throughput in by_run[run_id]:
            if point_id not in loads:
                continue
            engine, shape, load = loads[point_id]
            key = ModelKey(_gpu_label(gpu), str(vllm), shape.family, engine.enforce_eager, engine.kv_cache_dtype)
            measured = {"output_throughput": throughput, "tpot_s": tpot, "ttft_s": ttft, "window_s": window,
                        "burst_s": bursts.get((run_id, point_id), {}).get(min(load.concurrency, load.requests))}
            out.append(StoredPoint(study, run_id, point_id, arm, workload, load.concurrency, key, shape.name,
                                   shape, load, engine, card, measured))
    return out


def _bursts(con: Any) -> dict[tuple[str, str], dict[int, float]]:
    """Per point, the opening burst's last first token from the first measured send, for the burst
    sizes present: {(run_id, point_id): {slots: seconds}}. Only the first `slots` requests sent are
    the burst; later ones were sent as slots freed."""
    rows = con.execute(
        "SELECT r.run_id, r.point_id, p.concurrency, r.sent_s, r.first_token_s FROM requests r "
        "JOIN points p USING (run_id, point_id) WHERE NOT r.warmup AND r.ok AND p.concurrency > 1 "
        "ORDER BY r.run_id, r.point_id, r.sent_s"
    ).fetchall()
    sends: dict[tuple[str, str], list[tuple[float, float | None]]] = defaultdict(list)
    slots: dict[tuple[str, str], int] = {}
    for run_id, point_id, concurrency, sent, first in rows:
        sends[(run_id, point_id)].append((sent, first))
        slots[(run_id, point_id)] = int(concurrency)
    out: dict[tuple[str, str], dict[int, float]] = {}
    for key, reqs in sends.items():
        burst = reqs[: slots[key]]
        firsts = [f for _, f in burst if f is not None]
        if len(burst) == slots[key] and len(firsts) == len(burst):
            out[key] = {len(burst): max(firsts) - burst[0][0]}
    return out


# ---- fitting and validation -------------------------------------------------------------------
def fit_keys(points: Iterable[StoredPoint]) -> dict[ModelKey, Coefficients]:
    """Coefficients for every key the points cover."""
    by_key: dict[ModelKey, list[Observation]] = defaultdict(list)
    for p in points:
        by_key[p.key].append(p.observation)
    return {key: fit(obs).coefficients for key, obs in sorted(by_key.items(), key=lambda kv: kv[0].label())}


def leave_one_study_out(points: Sequence[StoredPoint]) -> list[Scored]:
    """For each study: fit on every other study, predict the held-out one. A point whose key (GPU,
    vLLM version, family, eager, KV dtype) or model shape no other study measured is not validated."""
    scored: list[Scored] = []
    for study in sorted({p.study for p in points}):
        train = [p for p in points if p.study != study]
        coefs = fit_keys(train)
        shapes = {(p.key, p.model) for p in train}
        for p in (q for q in points if q.study == study):
            coef = coefs.get(p.key)
            if coef is None:
                scored.append(Scored(p, None, False, f"no other study runs {p.key.label()}"))
                continue
            prediction = predict(p.shape, p.load, p.engine, p.card, coef)
            if (p.key, p.model) not in shapes:
                reason = (f"{p.model} appears in no other study: fixed cost and weight streaming were "
                          f"fitted on other model sizes only")
                scored.append(Scored(p, prediction, False, reason))
                continue
            scored.append(Scored(p, prediction, True, ""))
    return scored


def _why(s: Scored, metric: str, same_config: Sequence[Scored]) -> str:
    p = s.point
    measured = [v for q in same_config if (v := q.point.measured.get(metric))]
    spread = ""
    if len(measured) > 1:
        lo, hi = min(measured), max(measured)
        spread_pct = 100.0 * (hi - lo) / statistics.median(measured)
        spread = f"; its {len(measured)} repeats span {spread_pct:.0f}%"
    regime = f"{p.arm}/{p.workload} at concurrency {p.concurrency}"
    return regime + spread


def ledger(scored: Sequence[Scored]) -> list[dict[str, Any]]:
    """One row per study, GPU, vLLM version and metric over validated points: n, the median absolute
    percentage error, and the worst point (id, predicted, measured, signed error, why)."""
    groups: dict[tuple[str, str, str], list[Scored]] = defaultdict(list)
    for s in scored:
        if s.validated:
            groups[(s.point.study, s.point.key.gpu, s.point.key.vllm_version)].append(s)
    rows: list[dict[str, Any]] = []
    for (study, gpu, vllm), members in sorted(groups.items()):
        for metric in METRICS:
            errs = [(abs(e), e, s) for s in members if (e := s.error_pct(metric)) is not None]
            if not errs:
                continue
            worst_abs, worst_err, worst = max(errs, key=lambda t: t[0])
            same = [q for q in members if q.point.config == worst.point.config]
            assert worst.prediction is not None
            rows.append({
                "study": study,
                "gpu": gpu,
                "vllm_version": vllm,
                "metric": metric,
                "n": len(errs),
                "median_abs_pct_error": round(statistics.median(e for e, _, _ in errs), 2),
                "worst_point": {
                    "point_id": worst.point.point_id,
                    "predicted": _sig(getattr(worst.prediction, metric)),
                    "measured": _sig(worst.point.measured[metric]),
                    "error_pct": round(worst_err, 1),
                    "why": _why(worst, metric, same),
                },
            })
    return rows


def not_validated(scored: Sequence[Scored]) -> list[dict[str, Any]]:
    """Held-out points the ledger leaves out, one row per study and reason, with the count."""
    groups: dict[tuple[str, str], list[str]] = defaultdict(list)
    for s in scored:
        if not s.validated:
            groups[(s.point.study, s.reason)].append(s.point.point_id)
    return [{"study": study, "reason": reason, "n": len(ids), "points": sorted(ids)}
            for (study, reason), ids in sorted(groups.items())]


def _sig(value: float | None) -> float | None:
    return None if value is None else float(f"{value:.4g}")


# ---- predictions for a plan --------------------------------------------------------------------
def _match_gpu(hardware: str, gpus: Iterable[str]) -> str | None:
    want = re.sub(r"[^a-z0-9]", "", hardware.lower())
    for gpu in sorted(gpus):
        have = re.sub(r"[^a-z0-9]", "", gpu.lower())
        if want and (want in have or have in want or want.split("sxm")[0] == have.split("sxm")[0]):
            return gpu
    return None


def predict_plan(
    plan: dict[str, Any], db: str | Path, root: Path = REPO, exclude_runs: Iterable[str] = ()
) -> dict[str, dict[str, float | None]]:
    """`predicted = {output_throughput, tpot_s, ttft_s}` for every point of a plan (stored JSON, i.e.
    `json.loads(Plan.to_json())`), fitted from every run in `db` (but `exclude_runs`) on the plan's
    hardware with its newest vLLM version. Points whose key no run covers get None values."""
    skip = set(exclude_runs)
    points = [p for p in read_points(db, root) if p.run_id not in skip]
    gpu = _match_gpu(plan["hardware"], {p.key.gpu for p in points})
    on_gpu = [p for p in points if p.key.gpu == gpu]
    vllm = max((p.key.vllm_version for p in on_gpu), default=None, key=_version_tuple)
    fitted = fit_keys(p for p in on_gpu if p.key.vllm_version == vllm)
    cards = [p.card for p in on_gpu if p.key.vllm_version == vllm]
    out: dict[str, dict[str, float | None]] = {}
    empty: dict[str, float | None] = dict.fromkeys(METRICS)
    if gpu is None or vllm is None or not cards:
        return {pid: dict(empty) for pid in plan_loads(plan, root)}
    card = Card(statistics.median(c.bandwidth_Bps for c in cards), statistics.median(c.flops_per_s for c in cards))
    for pid, (engine, shape, load) in plan_loads(plan, root).items():
        coef = fitted.get(ModelKey(gpu, vllm, shape.family, engine.enforce_eager, engine.kv_cache_dtype))
        if coef is None:
            out[pid] = dict(empty)
            continue
        pr = predict(shape, load, engine, card, coef)
        out[pid] = {"output_throughput": pr.output_throughput, "tpot_s": pr.tpot_s, "ttft_s": pr.ttft_s}
    return out


def _version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", version))

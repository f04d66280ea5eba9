"""The step-time model's ledger: fit its coefficients from stored runs, validate it leave-one-study-out,
and tabulate its error by study, GPU, vLLM version and metric.

Reads the results database through `runner.store.store` only.
"""

from __future__ import annotations

import json
import re
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

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
from studyc import format as fmt

if TYPE_CHECKING:
    from runner.store.records import PointSummary
    from runner.store.store import Store

REPO = Path(__file__).resolve().parents[1]
METRICS = ("output_throughput", "tpot_s", "ttft_s")
# Checks about the steady phase inside the window. The model replays the whole measured window (warm-up
# sends excluded, ramp and drain included), so a point that fails only these still measures what it
# predicts; a point with any other failed fail-level check (errors, output, reconciliation) is left out.
# Warn-level failures (a kept cache, by design) and unverified checks do not leave a point out: the
# replay models the cache, and the client-side numbers are exact either way.
WINDOW_CHECKS = frozenset({"steady_state", "warmup_sufficient", "littles_law"})


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
    """A plan's model folder: relative to `root`; an absolute one that is not here (a plan compiled in
    another checkout) is found by its part from `models/` on, under `root`."""
    p = Path(model_dir)
    if not p.is_absolute():
        return root / p
    if not p.exists() and "models" in p.parts:
        local = root.joinpath(*p.parts[len(p.parts) - 1 - p.parts[::-1].index("models"):])
        if local.exists():
            return local
    return p


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
    for server in plan.get("launches", plan.get("servers", [])):  # schema v2 launches, v1 servers
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
    """Every valid, complete point of the latest calibrated run of each study in `db`, with what replays it."""
    from runner.store.store import Store

    with Store(db, read_only=True) as store:
        return store_points(store, root)


def store_points(store: Store, root: Path = REPO) -> list[StoredPoint]:
    """`read_points` from an open store (the runner's, while it writes the same file)."""
    out: list[StoredPoint] = []
    runs = [run for run in store.runs()
            if run.calibrated and run.plan_json and (run.bandwidth_Bps or 0) > 0 and (run.flops_bf16 or 0) > 0]
    latest = {}
    for run in sorted(runs, key=lambda r: (str(r.started_at or ""), r.run_id)):
        latest[run.study_id] = run.run_id
    for run in runs:
        if run.run_id != latest[run.study_id]:
            continue  # a study's latest run replaces its earlier ones
        assert run.bandwidth_Bps is not None and run.flops_bf16 is not None
        assert run.plan_json is not None
        loads = plan_loads(json.loads(run.plan_json), root)
        card = Card(float(run.bandwidth_Bps), float(run.flops_bf16))
        sends = store.send_times(run.run_id)
        failed: dict[str, set[str]] = defaultdict(set)
        for check in store.checks(run.run_id):
            if check.status == "fail" and check.severity == "fail":
                failed[check.point_id].add(check.name)
        for point in store.points(run.run_id):
            if point.status != "ok" or failed[point.point_id] - WINDOW_CHECKS or point.point_id not in loads:
                continue
            engine, shape, load = loads[point.point_id]
            key = ModelKey(_gpu_label(run.gpu_name), str(run.vllm_version), shape.family, engine.enforce_eager,
                           engine.kv_cache_dtype)
            s = whole_window(store.request_records(run.run_id, point.point_id), load.concurrency)
            measured = {"output_throughput": s.output_throughput, "tpot_s": s.tpot_mean_s,
                        "ttft_s": s.ttft_mean_s, "window_s": s.window_s,
                        "burst_s": _burst(sends.get(point.point_id, []), min(load.concurrency, load.requests))}
            out.append(StoredPoint(run.study_id, run.run_id, point.point_id, point.arm, point.workload,
                                   load.concurrency, key, shape.name, shape, load, engine, card, measured))
    return out


def whole_window(records: Sequence[Any], concurrency: int) -> PointSummary:
    """The point's statistics over its whole measured window (ramp and drain included), as the model
    replays it; the stored summary holds the steady phase where the point has one."""
    from runner.checks.stats import summarize

    return summarize(records, concurrency, burst=True)


def _burst(sends: Sequence[tuple[float, float | None]], slots: int) -> float | None:
    """The opening burst's last first token from the first measured send. Only the first `slots`
    requests sent are the burst (later ones were sent as slots freed); none for a single slot or
    where a burst request failed or has no first token."""
    burst = sends[:slots]
    firsts = [f for _, f in burst if f is not None]
    if slots < 2 or len(burst) < slots or len(firsts) < slots:
        return None
    return max(firsts) - burst[0][0]


# ---- fitting and validation -------------------------------------------------------------------
def fit_keys(points: Iterable[StoredPoint]) -> dict[ModelKey, Coefficients]:
    """Coefficients for every key the points cover (ValueError when a key's fit does not converge)."""
    by_key: dict[ModelKey, list[StoredPoint]] = defaultdict(list)
    for p in points:
        by_key[p.key].append(p)
    out = {}
    for key, used in sorted(by_key.items(), key=lambda kv: kv[0].label()):
        found = _fit_key(key, used)
        if isinstance(found, str):
            raise ValueError(found)
        out[key] = found
    return out


# Fits within one process, keyed by the model key and the training points' (run id, point id): a fit
# is a pure function of its observations, and the leave-one-study-out folds share most of theirs.
_FITS: dict[tuple[ModelKey, tuple[tuple[str, str], ...]], Coefficients | str] = {}


def _fit_key(key: ModelKey, points: Sequence[StoredPoint]) -> Coefficients | str:
    """The key's coefficients fitted on `points`, or why the fit failed; cached for the process."""
    ids = (key, tuple(sorted((p.run_id, p.point_id) for p in points)))
    if ids not in _FITS:
        try:
            _FITS[ids] = fit([p.observation for p in points]).coefficients
        except ValueError as exc:
            _FITS[ids] = f"the fit of {key.label()} failed: {exc}"
    return _FITS[ids]


_PREDICTIONS: dict[tuple[str, Load, EngineShape, Card, Coefficients], Prediction] = {}


def _predict(p: StoredPoint, coef: Coefficients) -> Prediction:
    """`predict` for the point, once per input (repeats of one config replay the same)."""
    inputs = (p.model, p.load, p.engine, p.card, coef)
    if inputs not in _PREDICTIONS:
        _PREDICTIONS[inputs] = predict(p.shape, p.load, p.engine, p.card, coef)
    return _PREDICTIONS[inputs]


def leave_one_study_out(points: Sequence[StoredPoint]) -> list[Scored]:
    """For each study: fit on every other study, predict the held-out one. A point whose key (GPU,
    vLLM version, family, eager, KV dtype) or model shape no other study measured, or whose key's fit
    on the other studies does not converge, is not validated. Each fold fits only the keys its held-out
    study needs, and a fit on the same training points is done once (see `_fit_key`)."""
    scored: list[Scored] = []
    for study in sorted({p.study for p in points}):
        train = [p for p in points if p.study != study]
        held = [q for q in points if q.study == study]
        by_key: dict[ModelKey, list[StoredPoint]] = defaultdict(list)
        for p in train:
            by_key[p.key].append(p)
        coefs = {key: _fit_key(key, by_key[key]) for key in {q.key for q in held} if by_key.get(key)}
        shapes = {(p.key, p.model) for p in train}
        for p in held:
            coef = coefs.get(p.key)
            if coef is None:
                scored.append(Scored(p, None, False, f"no other study runs {p.key.label()}"))
                continue
            if isinstance(coef, str):
                scored.append(Scored(p, None, False, coef))
                continue
            prediction = _predict(p, coef)
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


@dataclass(frozen=True)
class PointPrediction:
    """The model's prediction for one plan point: METRICS (None where it cannot predict) and, then, why."""

    values: dict[str, float | None]
    note: str = ""


def predict_points(
    plan: dict[str, Any], points: Sequence[StoredPoint], hardware: str | None = None, root: Path = REPO
) -> dict[str, PointPrediction]:
    """A prediction for every closed-loop point of a plan (stored JSON, i.e. `json.loads(Plan.to_json())`),
    fitted from `points` on `hardware` (a GPU name; the plan's `hardware` by default) with the newest
    vLLM version stored for it. Points no fit covers get None values and the reason."""
    want = hardware or plan["hardware"]
    gpu = _match_gpu(want, {p.key.gpu for p in points})
    on_gpu = [p for p in points if p.key.gpu == gpu]
    vllm = max((p.key.vllm_version for p in on_gpu), default=None, key=_version_tuple)
    loads = plan_loads(plan, root)
    if gpu is None or vllm is None:
        note = f"no calibrated run on {want} in the database"
        return {pid: PointPrediction(dict.fromkeys(METRICS), note) for pid in loads}
    used = [p for p in on_gpu if p.key.vllm_version == vllm]
    fitted = fit_keys(p for p in used if any(p.key == key_of(gpu, vllm, s, e) for _, (e, s, _) in loads.items()))
    card = Card(statistics.median(p.card.bandwidth_Bps for p in used),
                statistics.median(p.card.flops_per_s for p in used))
    out: dict[str, PointPrediction] = {}
    for pid, (engine, shape, load) in loads.items():
        key = key_of(gpu, vllm, shape, engine)
        coef = fitted.get(key)
        if coef is None:
            out[pid] = PointPrediction(dict.fromkeys(METRICS), f"no stored run measured {key.label()}")
            continue
        pr = predict(shape, load, engine, card, coef)
        out[pid] = PointPrediction({"output_throughput": pr.output_throughput, "tpot_s": pr.tpot_s,
                                    "ttft_s": pr.ttft_s})
    return out


def key_of(gpu: str, vllm: str, shape: ModelShape, engine: EngineShape) -> ModelKey:
    return ModelKey(gpu, vllm, shape.family, engine.enforce_eager, engine.kv_cache_dtype)


def predict_plan(
    plan: dict[str, Any], db: str | Path, root: Path = REPO, exclude_runs: Iterable[str] = ()
) -> dict[str, dict[str, float | None]]:
    """`predicted = {output_throughput, tpot_s, ttft_s}` for every point of a plan, fitted from every run
    in `db` (but `exclude_runs`) on the plan's hardware (see `predict_points`)."""
    skip = set(exclude_runs)
    points = [p for p in read_points(db, root) if p.run_id not in skip]
    return {pid: pp.values for pid, pp in predict_points(plan, points, root=root).items()}


def fitted_runs(points: Sequence[StoredPoint]) -> int:
    return len({p.run_id for p in points})


def _version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", version))


# ---- text for the command line -------------------------------------------------------------------
def _predicted(value: float | None, unit: str) -> str:
    """A predicted number in display unit `unit` (the column names it), through the one formatter."""
    return fmt.NOTHING if value is None else fmt.digits(value, unit, measured=False)


def prediction_rows(predicted: dict[str, PointPrediction]) -> list[tuple[str, str, str, str, str]]:
    """(point, tok/s, TPOT ms, TTFT ms, note) for each predicted point, as text."""
    return [(pid, _predicted(pp.values["output_throughput"], "tok/s"), _predicted(pp.values["tpot_s"], "ms"),
             _predicted(pp.values["ttft_s"], "ms"), pp.note) for pid, pp in predicted.items()]


def model_rows(points: Sequence[StoredPoint]) -> list[dict[str, Any]]:
    """The fitted coefficients of every key the points cover, with the points and runs behind them."""
    from compiler.stepmodel import coefficients_dict

    rows = []
    for key, coef in fit_keys(points).items():
        used = [p for p in points if p.key == key]
        rows.append({"gpu": key.gpu, "vllm_version": key.vllm_version, "family": key.family,
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


def format_ledger(rows: Sequence[dict[str, Any]], gaps: Sequence[dict[str, Any]], markdown: bool = False) -> str:
    head = ["study", "gpu", "vLLM", "metric", "n", "median |error| %", "worst point", "error %", "why"]
    body = [[r["study"], r["gpu"], r["vllm_version"], r["metric"], str(r["n"]), f"{r['median_abs_pct_error']:.2f}",
             r["worst_point"]["point_id"], f"{r['worst_point']['error_pct']:+.1f}", r["worst_point"]["why"]]
            for r in rows]
    text = _table(head, body, markdown)
    if gaps:
        text += "\nnot validated (never in the medians):\n"
        text += "".join(f"  {g['study']}: {g['n']} point(s): {g['reason']}\n" for g in gaps)
    return text


def _table(head: Sequence[str], body: Sequence[Sequence[str]], markdown: bool) -> str:
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(row) + " |" for row in body]
        return "\n".join(lines) + "\n"
    widths = [max(len(str(r[i])) for r in [head, *body]) for i in range(len(head))]
    return "".join("  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() + "\n"
                   for r in [head, *body])

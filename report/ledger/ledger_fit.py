"""The step-time model's fit and its validation: the stored points it learns from, coefficients per key fitted from stored points,
leave-one-study-out predictions, and the ledger of their error by study, GPU, vLLM version and metric."""

from __future__ import annotations

import os
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from base.settings import load_settings
from compiler.modelmath import ModelShape
from compiler.stepcost import Card, Coefficients, EngineShape
from compiler.stepfit import ModelKey, Observation, fit
from compiler.stepreplay import StepLoad, StepPrediction, predict
from report.ledger.fit_cache import FitCache, fit_digest
from runner.lifeline import die_with_parent

METRICS = ("output_throughput", "tpot_s", "ttft_s")
# The GPU of a fit key: coefficients are fitted on every GPU's points, each point priced on its own run's
# card (bandwidth and FLOP/s), so they carry to a GPU by its card.
ANY_GPU = "any GPU"


def fit_key(key: ModelKey) -> ModelKey:
    """The key a point's coefficients are fitted under: its own without the GPU."""
    return replace(key, gpu=ANY_GPU)


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
    load: StepLoad
    engine: EngineShape
    card: Card
    measured: dict[str, float | None]  # METRICS, plus window_s and burst_s
    saturated: str = ""  # why the point is near saturation (report.ledger.saturation), "" where it is not

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
    prediction: StepPrediction | None
    validated: bool
    reason: str

    def error_pct(self, metric: str) -> float | None:
        measured = self.point.measured.get(metric)
        if self.prediction is None or measured is None or not measured > 0:
            return None
        predicted = getattr(self.prediction, metric)
        return None if predicted is None else 100.0 * (predicted - measured) / measured


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
    return _fit_all([(key, points)], workers=1)[0]


def _fit_id(key: ModelKey, points: Sequence[StoredPoint]) -> tuple[ModelKey, tuple[tuple[str, str], ...]]:
    return key, tuple(sorted((p.run_id, p.point_id) for p in points))


def _fitted(label: str, observations: list[Observation]) -> Coefficients | str:
    """`fit`'s coefficients, or why it failed (a pure function: the same in a worker process)."""
    try:
        return fit(observations).coefficients
    except ValueError as exc:
        return f"the fit of {label} failed: {exc}"


def fit_workers() -> int:
    """Processes for the leave-one-study-out fits: STUDYC_FIT_WORKERS, else the CPUs this process may use."""
    named = os.environ.get("STUDYC_FIT_WORKERS", "").strip()
    if named.isdigit() and int(named) > 0:
        return int(named)
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def fit_cache() -> FitCache:
    """Where fits are kept between commands: `fits/` of the settings' cache folder, unless
    STUDYC_FIT_CACHE=0."""
    settings = load_settings()
    return FitCache(settings.cache_path / "fits" if settings.fit_cache else None)


def _fit_all(jobs: Sequence[tuple[ModelKey, Sequence[StoredPoint]]], workers: int) -> list[Coefficients | str]:
    """`_fit_key` of each (key, training points), in order: those not yet in `_FITS` read from the fit
    cache, the rest fitted `workers` at a time and kept there. Each fit is a pure function of its
    observations, so fitting them in worker processes gives the coefficients one process would."""
    ids = [_fit_id(key, points) for key, points in jobs]
    todo = {i: (key.label(), [p.observation for p in points])
            for i, (key, points) in zip(ids, jobs, strict=True) if i not in _FITS}
    kept = fit_cache() if todo else FitCache(None)
    digests = {i: fit_digest(*job) for i, job in todo.items()} if kept.folder is not None else {}
    for i, digest in digests.items():
        found = kept.get(digest)
        if found is not None:
            _FITS[i] = found
            del todo[i]
    if workers <= 1 or len(todo) <= 1:
        for i, (label, observations) in todo.items():
            _FITS[i] = _fitted(label, observations)
    else:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        # spawn: a fresh interpreter per worker, nothing inherited from this one (a database's threads)
        # die_with_parent: a SIGKILLed `studyc model --ledger` (a timeout) leaves no fit running
        with ProcessPoolExecutor(min(workers, len(todo)), mp_context=multiprocessing.get_context("spawn"),
                                 initializer=die_with_parent, initargs=(os.getpid(),)) as pool:
            for i, found in zip(todo, pool.map(_fitted, *zip(*todo.values(), strict=True)), strict=True):
                _FITS[i] = found
    for i in todo:
        if i in digests:
            kept.put(digests[i], _FITS[i])
    return [_FITS[i] for i in ids]


_PREDICTIONS: dict[tuple[str, StepLoad, EngineShape, Card, Coefficients], StepPrediction] = {}


def _predict(p: StoredPoint, coef: Coefficients) -> StepPrediction:
    """`predict` for the point, once per input (repeats of one config replay the same)."""
    inputs = (p.model, p.load, p.engine, p.card, coef)
    if inputs not in _PREDICTIONS:
        _PREDICTIONS[inputs] = predict(p.shape, p.load, p.engine, p.card, coef)
    return _PREDICTIONS[inputs]


def _folds(points: Sequence[StoredPoint]) -> list[tuple[list[StoredPoint], list[StoredPoint],
                                                         dict[ModelKey, list[StoredPoint]]]]:
    """Per study: (its training points, its held-out points, the training points of each key it needs)."""
    folds = []
    for study in sorted({p.study for p in points}):
        train = [p for p in points if p.study != study]
        held = [q for q in points if q.study == study]
        by_key: dict[ModelKey, list[StoredPoint]] = defaultdict(list)
        for p in train:
            by_key[fit_key(p.key)].append(p)
        needed = {fit_key(q.key) for q in held}
        folds.append((train, held, {k: v for k, v in by_key.items() if k in needed}))
    return folds


def leave_one_study_out(points: Sequence[StoredPoint], workers: int | None = None) -> list[Scored]:
    """For each study: fit on every other study, predict the held-out one. Keys are fitted across GPUs
    (`fit_key`), each point priced on its own run's card. A point whose key (vLLM version, family, eager,
    KV dtype) or model shape no other study measured on any GPU, or whose key's fit on the other studies
    does not converge, is not validated. Each fold fits only the keys its held-out
    study needs, and a fit on the same training points is done once (see `_fit_key`); the folds' fits
    run in `workers` processes (default `fit_workers()`)."""
    folds = _folds(points)
    fitted = iter(_fit_all([(key, used) for *_, by_key in folds for key, used in by_key.items()],
                           fit_workers() if workers is None else workers))
    scored: list[Scored] = []
    for train, held, by_key in folds:
        coefs = {key: next(fitted) for key in by_key}
        shapes = {(fit_key(p.key), p.model) for p in train}
        for p in held:
            coef = coefs.get(fit_key(p.key))
            if coef is None:
                scored.append(Scored(p, None, False, f"no other study runs {fit_key(p.key).label()}"))
                continue
            if isinstance(coef, str):
                scored.append(Scored(p, None, False, coef))
                continue
            prediction = _predict(p, coef)
            if (fit_key(p.key), p.model) not in shapes:
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
    percentage error, how many of the n are near saturation, and the worst point (id, predicted, measured,
    signed error, why, why it is near saturation or "")."""
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
            _, worst_err, worst = max(errs, key=lambda t: t[0])
            same = [q for q in members if q.point.config == worst.point.config]
            rows.append({
                "study": study,
                "gpu": gpu,
                "vllm_version": vllm,
                "metric": metric,
                "n": len(errs),
                "median_abs_pct_error": round(statistics.median(e for e, _, _ in errs), 2),
                "saturated": sum(bool(s.point.saturated) for _, _, s in errs),
                "worst_point": _worst(worst, worst_err, metric, same),
            })
    return rows


def _worst(s: Scored, error: float, metric: str, same_config: Sequence[Scored]) -> dict[str, Any]:
    assert s.prediction is not None
    return {"point_id": s.point.point_id, "predicted": _sig(getattr(s.prediction, metric)),
            "measured": _sig(s.point.measured[metric]), "error_pct": round(error, 1),
            "why": _why(s, metric, same_config), "saturated": s.point.saturated}


def _median(values: Sequence[float]) -> float | None:
    return round(statistics.median(values), 2) if values else None


def gpu_ledger(scored: Sequence[Scored]) -> list[dict[str, Any]]:
    """One row per GPU and metric over every validated point of every study: n, the median absolute
    percentage error, the same over the points near saturation (`StoredPoint.saturated`) and over the
    rest, and the worst point."""
    groups: dict[str, list[Scored]] = defaultdict(list)
    for s in scored:
        if s.validated:
            groups[s.point.key.gpu].append(s)
    rows: list[dict[str, Any]] = []
    for gpu, members in sorted(groups.items()):
        for metric in METRICS:
            errs = [(abs(e), e, s) for s in members if (e := s.error_pct(metric)) is not None]
            if not errs:
                continue
            _, worst_err, worst = max(errs, key=lambda t: t[0])
            same = [q for q in members if q.point.study == worst.point.study and q.point.config == worst.point.config]
            rows.append({
                "gpu": gpu,
                "metric": metric,
                "n": len(errs),
                "median_abs_pct_error": _median([e for e, _, _ in errs]),
                "saturated": sum(bool(s.point.saturated) for _, _, s in errs),
                "median_abs_pct_error_saturated": _median([e for e, _, s in errs if s.point.saturated]),
                "median_abs_pct_error_unsaturated": _median([e for e, _, s in errs if not s.point.saturated]),
                "studies": len({s.point.study for _, _, s in errs}),
                "worst_point": _worst(worst, worst_err, metric, same),
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

"""Fit the step-time coefficients to measured points: replay, non-negative least squares, repeat.

Pure. For a fixed step composition every replayed TPOT, TTFT and window is linear in the
coefficients (`compiler.stepreplay`); the composition itself depends on them, so `fit` alternates
replay and an exact non-negative least squares until the coefficients stop moving.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from compiler.modelmath import ModelShape
from compiler.stepcost import COEFFICIENT_NAMES, ZERO_TERMS, Card, Coefficients, EngineShape, Terms, scale
from compiler.stepreplay import PointTerms, StepLoad, replay


@dataclass(frozen=True)
class ModelKey:
    """What coefficients are fitted for: they do not carry across these."""

    gpu: str
    vllm_version: str
    family: str
    enforce_eager: bool
    kv_cache_dtype: str

    def label(self) -> str:
        mode = "eager" if self.enforce_eager else "graphs"
        return f"{self.gpu} / vLLM {self.vllm_version} / {self.family} / {mode} / kv {self.kv_cache_dtype}"


@dataclass(frozen=True)
class Observation:
    """One measured point and what replays it: the fit's unit of data. `burst_s` is the last first
    token of the opening burst, from the first send (the requests table's per-request times)."""

    shape: ModelShape
    load: StepLoad
    engine: EngineShape
    card: Card
    tpot_s: float | None
    ttft_s: float | None
    window_s: float | None
    burst_s: float | None = None


# Relative weights of the measured quantities, and the pull of `mem` and `flop` toward 1.0 (the
# calibrated peaks) so that a few studies that cannot separate them still fit physically. The opening
# burst's last first token weighs as little as the mean TTFT: one number per point, set by the front end's
# admissions more than by the steps (at 1.0 the ledger's TTFT error was larger: docs/predictions.md).
FIT_WEIGHTS = {"tpot": 1.0, "window": 1.0, "burst": 0.3, "ttft": 0.3}
PRIOR_WEIGHT = 0.05
# Where the fixed-point fit starts: graphs-mode constants of a datacenter GPU, the peaks, a few
# milliseconds of front end. The fit converges to the same point from any reasonable start.
START = Coefficients(step_s=2e-3, seq_s=0.0, mem=1.0, flop=1.0, request_s=0.01, admit_s=0.003)
MAX_ITERATIONS = 40
# The overlap p values `fit` tries (1: streaming and compute add; 4: within 19% of the slower one).
OVERLAPS = (1.0, 2.0, 4.0)
# The front-end costs per request `fit` tries for admit_s (seconds). On the H200 a burst of 128 requests
# of 1,024 prompt tokens reached the engine over ~0.28 s (~2.2 ms each); slower hosts and eager mode
# spend more.
ADMITS = (1e-3, 2e-3, 3e-3, 4e-3, 6e-3)
# Converged when no coefficient moves by more than 0.1% (relative; absolute below 1e-6). The step
# composition is discrete (a request admitted one step earlier or later), so the iteration can end in
# a cycle between two compositions whose coefficients differ by a few 0.01%: that is converged.
TOLERANCE = 1e-3
# Full fixed-point steps first. After a cycle too wide to pick from (or UNDAMPED_ITERATIONS), steps go
# half way, and a step after which the change did not shrink is halved again (down to MIN_DAMPING):
# the composition can make the full step overshoot back and forth between two compositions.
UNDAMPED_ITERATIONS = 8
MIN_DAMPING = 0.125
# At the shortest steps the iteration can still jump between compositions (the map from coefficients to
# composition is discontinuous; typically `admit_s` moves a request to the step before or after). Once
# the change has shrunk by less than a fifth over SETTLE_ITERATIONS iterations and their iterates span less than
# SETTLE_SPREAD of every coefficient, the fit is the one among them with the least residual on its own
# replay.
SETTLE_ITERATIONS = 6
SETTLE_SPREAD = 0.25
CYCLE_SPREAD = 0.05


@dataclass(frozen=True)
class Fit:
    coefficients: Coefficients
    iterations: int
    changes: tuple[float, ...]  # the largest relative coefficient change after each iteration
    cycle: int = 0  # length of the cycle it ended in (0: a fixed point)
    spread: float = 0.0  # the cycle's largest relative coefficient difference


def fit(observations: Sequence[Observation], prior: float = PRIOR_WEIGHT, start: Coefficients = START,
        overlaps: Sequence[float] = OVERLAPS, admits: Sequence[float] = ADMITS) -> Fit:
    """The fit (see `fit_at`) at each overlap p in `overlaps` and each front-end cost `admit_s` in
    `admits`, held fixed there; the one with the least residual on `observations`, each on its own
    replay, wins; then `admit_s` is freed, starting from that fit, and the result kept if it explains
    the data better. `admit_s` decides which step a request joins, so the fixed-point iteration moves
    it in jumps and, started far off, can settle far from the best fit. Replays are shared between
    them (the residuals replay coefficients the iteration already replayed)."""
    best: tuple[float, Fit] | None = None
    memo: _Memo = {}
    failures: list[str] = []
    for p in overlaps:
        for admit in admits:
            try:
                result = fit_at(observations, prior, replace(start, overlap=p, admit_s=admit), memo, admit_s=admit)
            except ValueError as exc:
                failures.append(f"overlap {p:g}, admit {1e3 * admit:g} ms: {exc}")
                continue
            residual = _residual(observations, result.coefficients, prior, memo)
            if best is None or residual < best[0]:
                best = (residual, result)
    if best is None:
        raise ValueError("; ".join(failures))
    # Then admit_s free, from the best of the grid: kept where it explains the data better.
    try:
        free = fit_at(observations, prior, best[1].coefficients, memo)
    except ValueError:
        return best[1]
    return free if _residual(observations, free.coefficients, prior, memo) < best[0] else best[1]


def fit_at(observations: Sequence[Observation], prior: float = PRIOR_WEIGHT, start: Coefficients = START,
           memo: _Memo | None = None, admit_s: float | None = None) -> Fit:
    """Replay every observation with the current coefficients, fit the coefficients by exact
    non-negative least squares on the replayed features (linear for a fixed step composition), and
    repeat until no coefficient moves by more than TOLERANCE. The composition is discrete, so the
    iteration may instead return to an earlier iterate (a cycle of compositions, one request admitted a
    step earlier or later); then the fit is the cycle's member that explains the data best on its own
    replay, provided the cycle spans less than CYCLE_SPREAD of every coefficient. A wider cycle, or no
    convergence in UNDAMPED_ITERATIONS, switches to damped steps, which settle as described at
    SETTLE_SPREAD. Fails otherwise. With `admit_s`, that coefficient is held at it."""
    if not observations:
        raise ValueError("nothing to fit: no point with a measured TPOT, TTFT or window")
    coef = start
    seen: list[Coefficients] = []
    changes: list[float] = []
    damping = 1.0  # full steps until a cycle too wide to pick from, or UNDAMPED_ITERATIONS pass
    for iteration in range(1, MAX_ITERATIONS + 1):
        points = replay_all(observations, coef, memo)
        new = replace(fit_linear(observations, points, prior, admit_s), overlap=coef.overlap)
        change = _change(new, coef)
        changes.append(change)
        if change <= TOLERANCE:
            return Fit(new, iteration, tuple(changes))
        if damping == 1.0 and iteration > UNDAMPED_ITERATIONS:
            damping = 0.5
        elif damping < 1.0 and change >= changes[-2]:
            damping = max(damping / 2, MIN_DAMPING)  # not contracting: take shorter steps
        step = _toward(coef, new, damping)
        repeat = next((i for i, old in enumerate(seen) if _change(step, old) <= 1e-9), None)
        seen.append(coef)
        if repeat is not None and damping == 1.0:
            cycle = seen[repeat:]
            spread = max(_change(a, b) for a in cycle for b in cycle)
            if spread <= CYCLE_SPREAD:
                best = min(cycle, key=lambda c: _residual(observations, c, prior, memo))
                return Fit(best, iteration, tuple(changes), cycle=len(cycle), spread=spread)
            damping = 0.5
            step = _toward(coef, new, damping)
        coef = step
        recent = [*seen[-SETTLE_ITERATIONS + 1:], coef]
        stalled = len(changes) >= SETTLE_ITERATIONS and changes[-1] >= 0.8 * changes[-SETTLE_ITERATIONS]
        if damping <= MIN_DAMPING and stalled:
            spread = max(_change(a, b) for a in recent for b in recent)
            if spread <= SETTLE_SPREAD:  # shortest steps still jump between compositions: settled
                best = min(recent, key=lambda c: _residual(observations, c, prior, memo))
                return Fit(best, iteration, tuple(changes), cycle=len(recent), spread=spread)
    raise ValueError(f"fit did not converge in {len(changes)} iterations (last changes {changes[-3:]})")


def _toward(a: Coefficients, b: Coefficients, fraction: float) -> Coefficients:
    """The coefficients `fraction` of the way from `a` to `b` (a damped fixed-point step)."""
    if fraction >= 1.0:
        return b
    moved = [x + fraction * (y - x) for x, y in zip(a.as_terms(), b.as_terms(), strict=True)]
    return replace(a, **dict(zip(COEFFICIENT_NAMES, moved, strict=False)))


# Replays already made, by (model shape, load, engine, card, coefficients): a replay is a pure function of them.
_Memo = dict[tuple[int, StepLoad, EngineShape, Card, Coefficients], PointTerms]


def replay_all(observations: Sequence[Observation], coef: Coefficients, memo: _Memo | None = None) -> list[PointTerms]:
    """`replay` of every observation; observations with the same inputs (repeats of one config) share one,
    and so do calls that pass the same `memo`."""
    done: _Memo = {} if memo is None else memo
    out = []
    for ob in observations:
        key = (id(ob.shape), ob.load, ob.engine, ob.card, coef)
        if key not in done:
            done[key] = replay(ob.shape, ob.load, ob.engine, ob.card, coef)
        out.append(done[key])
    return out


def _change(a: Coefficients, b: Coefficients) -> float:
    return max(abs(x - y) / max(abs(y), 1e-6) for x, y in zip(a.as_terms(), b.as_terms(), strict=True))


def _residual(observations: Sequence[Observation], coef: Coefficients, prior: float, memo: _Memo | None = None) -> float:
    points = replay_all(observations, coef, memo)
    c = coef.as_terms()
    return sum((sum(a * b for a, b in zip(r, c, strict=True)) - y) ** 2
               for r, y in _rows(observations, points, prior))


def fit_linear(observations: Sequence[Observation], points: Sequence[PointTerms], prior: float = PRIOR_WEIGHT,
               admit_s: float | None = None) -> Coefficients:
    """Non-negative least squares on relative errors of TPOT, window, burst and TTFT for replayed
    points, with `mem` and `flop` pulled toward 1.0 by `prior`. Exact: every subset of coefficients
    held at zero is tried. With `admit_s`, that coefficient is held at it and the others fitted."""
    rows = _rows(observations, points, prior)
    if admit_s is not None:
        held = len(ZERO_TERMS) - 1  # admit_s is the last term
        rows = [(r[:held], y - r[held] * admit_s) for r, y in rows]  # type: ignore[misc]
    k = len(rows[0][0])
    gram = [[sum(r[i] * r[j] for r, _ in rows) for j in range(k)] for i in range(k)]
    moment = [sum(r[i] * y for r, y in rows) for i in range(k)]
    total = sum(y * y for _, y in rows)
    best: tuple[float, list[float]] | None = None
    for active in itertools.product((True, False), repeat=k):
        idx = [i for i in range(k) if active[i]]
        if not idx:
            continue
        x = _solve([[gram[i][j] for j in idx] for i in idx], [moment[i] for i in idx])
        if x is None or any(v < 0 for v in x):
            continue
        full = [0.0] * k
        for i, v in zip(idx, x, strict=True):
            full[i] = v
        # |A x - y|^2 from the normal equations' sums
        err = (sum(full[i] * gram[i][j] * full[j] for i in idx for j in idx)
               - 2 * sum(full[i] * moment[i] for i in idx) + total)
        if best is None or err < best[0] - 1e-12:
            best = (err, full)
    if best is None:
        raise ValueError("no non-negative fit exists")
    values = best[1] if admit_s is None else [*best[1], admit_s]
    return Coefficients(*values)  # overlap 1: the caller sets the one it replayed with


def _rows(
    observations: Sequence[Observation], points: Sequence[PointTerms], prior: float
) -> list[tuple[Terms, float]]:
    """The least-squares rows: weighted relative errors, then the pull of mem and flop to 1.0."""
    k = len(ZERO_TERMS)
    rows: list[tuple[Terms, float]] = []
    for ob, pt in zip(observations, points, strict=True):
        for name, features, fixed, measured in (
            ("tpot", pt.tpot, pt.tpot_fixed, ob.tpot_s),
            ("window", pt.window, pt.window_fixed, ob.window_s),
            ("burst", pt.burst, pt.burst_fixed, ob.burst_s),
            ("ttft", pt.ttft, pt.ttft_fixed, ob.ttft_s),
        ):
            if measured is None or not measured > 0 or not any(features):
                continue
            # relative error (features . coef + fixed - measured) / measured, weighted
            w = FIT_WEIGHTS[name] / measured
            rows.append((tuple(f * w for f in scale(features, ob.card)),  # type: ignore[arg-type]
                         FIT_WEIGHTS[name] * (measured - fixed) / measured))
    if not rows:
        raise ValueError("nothing to fit: no point with a measured TPOT, TTFT or window")
    prior = prior * math.sqrt(len(rows))
    for i in (2, 3):  # mem, flop
        rows.append((tuple(prior if j == i else 0.0 for j in range(k)), prior))  # type: ignore[arg-type]
    return rows


def _solve(a: list[list[float]], b: list[float]) -> list[float] | None:
    """The normal equations a x = b (Gaussian elimination with pivoting, columns scaled); None if singular."""
    k = len(b)
    scales = [math.sqrt(a[i][i]) or 1.0 for i in range(k)]
    a = [[a[i][j] / (scales[i] * scales[j]) for j in range(k)] for i in range(k)]
    b = [b[i] / scales[i] for i in range(k)]
    for col in range(k):
        pivot = max(range(col, k), key=lambda r: abs(a[r][col]))
        if abs(a[pivot][col]) < 1e-12:
            return None
        a[col], a[pivot] = a[pivot], a[col]
        b[col], b[pivot] = b[pivot], b[col]
        for r in range(k):
            if r != col:
                factor = a[r][col] / a[col][col]
                a[r] = [x - factor * y for x, y in zip(a[r], a[col], strict=True)]
                b[r] -= factor * b[col]
    return [b[i] / a[i][i] / scales[i] for i in range(k)]

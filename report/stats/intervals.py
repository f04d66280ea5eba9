"""Intervals at the level that really varies: launches between, repeats within. Pure statistics.

A point's metric is measured on several launches (server instances), each with a few repeats. The
repeats of one launch share everything a launch fixes (placement, compile, allocator state), so the
unit of replication is the launch: the estimate is the mean of launch means with a t interval on the
launch means (df = launches - 1). With one launch the interval falls back to the repeats and says
that launch-to-launch variation is not in it (`Interval.one_launch`: scoring decides nothing on it).

A ratio of two sides is paired only where the design pairs them: the two sides' launches of the same
block (or, on one shared launch, the same repeat cycle). Otherwise it is a ratio of means, unpaired:
the delta method on the log scale with Welch-Satterthwaite degrees of freedom. Ratios are summarized
on the log scale, so their intervals are positive.

A non-exchangeable observation (the plan says it differs from its siblings by construction, e.g. the
cold first repeat of a kept-cache launch) is left out and reported.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from statistics import NormalDist
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from compiler.plan import Plan

Critical = Callable[[float], float]  # degrees of freedom -> multiplier of the standard error

SINGLE_LAUNCH = "single launch: launch-to-launch variation not included"


# -- Student's t, pure ---------------------------------------------------------------------------------


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz)."""
    tiny, qab, qap, qam = 1e-300, a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        step = d * c
        h *= step
        if abs(step - 1.0) < 1e-15:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    lead = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return lead * _betacf(a, b, x) / a
    return 1.0 - lead * _betacf(b, a, 1.0 - x) / b


def t_cdf(x: float, df: float) -> float:
    """P(T <= x) for Student's t with `df` (> 0, may be fractional or inf) degrees of freedom."""
    if math.isinf(df):
        return NormalDist().cdf(x)
    tail = 0.5 * _betainc(df / 2.0, 0.5, df / (df + x * x))
    return 1.0 - tail if x > 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The p quantile of Student's t (0 < p < 1), by bisection on `t_cdf` (exact to ~1e-10)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"probability must be in (0, 1), got {p}")
    if df <= 0:
        raise ValueError(f"degrees of freedom must be > 0, got {df}")
    if math.isinf(df) or df > 1e7:
        return NormalDist().inv_cdf(p)
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    return bisect_quantile(lambda x: t_cdf(x, df), p, 1.0)


def bisect_quantile(cdf: Callable[[float], float], p: float, hi: float) -> float:
    """The p quantile of a distribution on [0, inf) with this increasing `cdf`: `hi` doubled until it
    bounds it, then bisection to ~1e-12 relative."""
    lo = 0.0
    while cdf(hi) < p:
        lo, hi = hi, hi * 2.0
    for _ in range(200):
        mid = (lo + hi) / 2.0
        if cdf(mid) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12 * max(1.0, hi):
            break
    return (lo + hi) / 2.0


@lru_cache(maxsize=4096)
def fixed_critical(df: float) -> float:
    """A fixed design's 95% two-sided multiplier: t(0.975, df)."""
    return t_quantile(0.975, df)


# -- observations --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Obs:
    """One measured value: a repeat of a point, or one server's value of a server metric."""

    id: str  # point or server id
    value: float
    launch: str  # launch id: the unit of replication
    block: int | None  # the design block of that launch; None when unknown (no plan)
    repeat: int = 1  # repeat inside the launch (a server metric: the replica)
    exchangeable: bool = True
    why: str = ""  # why not exchangeable


@dataclass(frozen=True)
class Interval:
    """The estimate of a point's metric or of a ratio, with its interval (at the multiplier it was given: 95%
    for a fixed design, a sequential look's own) and how it was made."""

    n: int  # units the interval rests on: launches, blocks, repeats (one launch), or values
    mean: float
    ci_low: float
    ci_high: float
    spread_low: float  # min-max over the units
    spread_high: float
    units: tuple[float, ...]  # the unit values (launch means, block ratios, repeats)
    level: str  # "launches" | "blocks" | "repeats" | "value"
    method: str  # one line: what was computed
    df: float | None = None
    single_launch: bool = False
    log_scale: bool = False
    excluded: tuple[tuple[str, str], ...] = ()  # (id, why) of non-exchangeable observations left out
    unpaired: int = 0  # launches (or repeats) without a partner where the design pairs
    zero_denominator: int = 0  # pairs left out for a zero denominator
    blocks: tuple[int, ...] = ()  # the design blocks it used: the paired blocks of a paired ratio, else its values'

    @property
    def one_launch(self) -> bool:
        """Launch-to-launch variation is not in it: one launch per side (or both on one), or a single value."""
        return self.single_launch or self.n < 2

    @property
    def notes(self) -> tuple[str, ...]:
        out = [SINGLE_LAUNCH] if self.single_launch else []
        out += [f"{i}: left out, not exchangeable ({why})" for i, why in self.excluded]
        return tuple(out)


@dataclass(frozen=True)
class _Mean:
    mean: float
    var: float  # of the mean
    df: float  # 0: no spread known (one value)
    n: int
    units: tuple[float, ...]
    level: str
    single_launch: bool


def _plain(values: Sequence[float]) -> tuple[float, float, float]:
    """(mean, variance of the mean, df) of a sample."""
    n = len(values)
    mean = math.fsum(values) / n
    if n < 2:
        return mean, 0.0, 0.0
    var = math.fsum((v - mean) ** 2 for v in values) / (n - 1)
    return mean, var / n, float(n - 1)


def _by_launch(obs: Sequence[Obs]) -> dict[str, list[Obs]]:
    out: dict[str, list[Obs]] = {}
    for o in sorted(obs, key=lambda o: (o.block or 0, o.launch, o.repeat, o.id)):
        out.setdefault(o.launch, []).append(o)
    return out


def _side_mean(obs: Sequence[Obs]) -> _Mean:
    """Mean of launch means (t on the launch means); one launch: the mean of its repeats."""
    launches = _by_launch(obs)
    if len(launches) >= 2:
        means = [math.fsum(o.value for o in g) / len(g) for g in launches.values()]
        mean, var, df = _plain(means)
        return _Mean(mean, var, df, len(means), tuple(means), "launches", False)
    values = [o.value for o in obs]
    mean, var, df = _plain(values)
    return _Mean(mean, var, df, len(values), tuple(values), "repeats" if len(values) > 1 else "value",
                 len(values) > 1)


def run_look(blocks: Collection[int | None]) -> int:
    """The look some blocks were read at: the number of the last of them, the run's look after that block,
    whatever blocks before it are missing (one set aside after the run, a block a resume ran again); with no
    block known, how many there are. A look counts the run's blocks, not the blocks an interval uses."""
    known = [b for b in blocks if b is not None]
    return max(known) if known else len(blocks)


def _blocks(*sides: Sequence[Obs]) -> tuple[int, ...]:
    """The known design blocks of some observations, sorted."""
    return tuple(sorted({o.block for side in sides for o in side if o.block is not None}))


def split(obs: Sequence[Obs]) -> tuple[list[Obs], tuple[tuple[str, str], ...]]:
    """(exchangeable observations, (id, why) of those left out)."""
    kept = [o for o in obs if o.exchangeable]
    out = tuple((o.id, o.why or "not exchangeable") for o in obs if not o.exchangeable)
    return kept, out


def mean_interval(obs: Sequence[Obs], critical: Critical = fixed_critical) -> Interval:
    """A point's metric: the mean of launch means with a t interval on them (df = launches - 1); with one
    launch, the repeats' t interval marked single launch; one value: the value itself."""
    kept, excluded = split(obs)
    if not kept:
        raise ValueError("no exchangeable observations")
    m = _side_mean(kept)
    half = critical(m.df) * math.sqrt(m.var) if m.df > 0 else 0.0
    what = {"launches": f"t on {m.n} launch means, df {m.n - 1}",
            "repeats": f"t on {m.n} repeats of one launch, df {m.n - 1}", "value": "one value"}[m.level]
    return Interval(m.n, m.mean, m.mean - half, m.mean + half, min(m.units), max(m.units), m.units, m.level,
                    what, m.df or None, m.single_launch, False, excluded, blocks=_blocks(kept))


def ratio_interval(top: Sequence[Obs], bottom: Sequence[Obs], critical: Critical = fixed_critical) -> Interval:
    """numerator / denominator, paired only where the design pairs the two sides, else a ratio of means."""
    kept_top, ex_top = split(top)
    kept_bottom, ex_bottom = split(bottom)
    excluded = ex_top + ex_bottom
    if not kept_top or not kept_bottom:
        raise ValueError("no exchangeable observations on one side of the ratio")
    positive = min(o.value for o in (*kept_top, *kept_bottom)) > 0
    paired = _paired(kept_top, kept_bottom, positive)
    if paired is not None:
        d, unpaired, zeros, level, single, blocks = paired
        if len(d) >= 2:
            return replace(_from_pairs(d, unpaired, zeros, level, single, positive, excluded, critical),
                           blocks=blocks)
    return replace(_unpaired(kept_top, kept_bottom, positive, excluded, critical),
                   blocks=_blocks(kept_top, kept_bottom))


def _paired(
    top: Sequence[Obs], bottom: Sequence[Obs], positive: bool
) -> tuple[list[float], int, int, str, bool, tuple[int, ...]] | None:
    """Per-pair ratios (log ratios when positive) where the design pairs: both sides on one shared launch
    (pair repeat with repeat: they run in the same cycle), or launches of the same known block (pair
    launch mean with launch mean); with the blocks the pairs come from. None when nothing is paired by
    design."""
    lt, lb = _by_launch(top), _by_launch(bottom)

    def ratio(a: float, b: float) -> float | None:
        if b == 0:
            return None
        return math.log(a / b) if positive else a / b

    if len(lt) == 1 and lt.keys() == lb.keys():
        at = {o.repeat: o.value for o in top}
        ab = {o.repeat: o.value for o in bottom}
        keys = sorted(set(at) & set(ab))
        pairs = [ratio(at[k], ab[k]) for k in keys]
        d = [x for x in pairs if x is not None]
        return d, len(set(at) ^ set(ab)), len(pairs) - len(d), "repeats", True, _blocks(top, bottom)
    bt = _block_means(lt)
    bb = _block_means(lb)
    if bt is None or bb is None:
        return None
    shared = sorted(set(bt) & set(bb))
    if not shared:
        return None
    by_block = {k: ratio(bt[k], bb[k]) for k in shared}
    d = [x for x in by_block.values() if x is not None]
    unpaired = len(set(bt) ^ set(bb))
    used = tuple(k for k, x in by_block.items() if x is not None)
    return d, unpaired, len(by_block) - len(d), "blocks", False, used


def _block_means(launches: dict[str, list[Obs]]) -> dict[int, float] | None:
    """Block -> that launch's mean; None when a block is unknown or holds two launches of one side."""
    out: dict[int, float] = {}
    for group in launches.values():
        block = group[0].block
        if block is None or block in out:
            return None
        out[block] = math.fsum(o.value for o in group) / len(group)
    return out


def _from_pairs(
    d: list[float], unpaired: int, zeros: int, level: str, single: bool, positive: bool,
    excluded: tuple[tuple[str, str], ...], critical: Critical,
) -> Interval:
    mean, var, df = _plain(d)
    half = critical(df) * math.sqrt(var)
    units = [math.exp(x) for x in d] if positive else d
    what = (f"paired: t on {len(d)} block log-ratios, df {len(d) - 1}" if level == "blocks"
            else f"paired on one launch: t on {len(d)} repeat log-ratios, df {len(d) - 1}")
    if positive:
        return Interval(len(d), math.exp(mean), math.exp(mean - half), math.exp(mean + half), min(units),
                        max(units), tuple(units), level, what, df, single, True, excluded, unpaired, zeros)
    return Interval(len(d), mean, mean - half, mean + half, min(units), max(units), tuple(units), level,
                    what.replace("log-ratios", "ratios (linear: a value is not positive)"), df, single, False,
                    excluded, unpaired, zeros)


def welch_df(parts: Sequence[tuple[float, float]]) -> float:
    """Welch-Satterthwaite degrees of freedom of a sum of variances [(variance, df)]; parts with no spread
    known (df 0) or no variance carry none. 0 when nothing has spread."""
    used = [(v, df) for v, df in parts if v > 0 and df > 0]
    if not used:
        return 0.0
    return sum(v for v, _ in used) ** 2 / sum(v * v / df for v, df in used)


def _unpaired(
    top: Sequence[Obs], bottom: Sequence[Obs], positive: bool, excluded: tuple[tuple[str, str], ...],
    critical: Critical,
) -> Interval:
    """Ratio of means: log(mean_t / mean_b) with var = var_t / mean_t^2 + var_b / mean_b^2 (delta method),
    Welch df; linear (var = (var_t + r^2 var_b) / mean_b^2) when a value is not positive."""
    a, b = _side_mean(top), _side_mean(bottom)
    if b.mean == 0:
        raise ZeroDivisionError("the denominator's mean is zero")
    single = a.single_launch or b.single_launch
    n = min(a.n, b.n)
    lo_units = min(a.units) / max(b.units) if max(b.units) else math.inf
    hi_units = max(a.units) / min(b.units) if min(b.units) else math.inf
    spread = (min(lo_units, hi_units), max(lo_units, hi_units))
    level = "launches" if a.level == b.level == "launches" else ("value" if n == 1 else "repeats")
    if positive:
        va, vb = a.var / a.mean ** 2, b.var / b.mean ** 2
        df = welch_df([(va, a.df), (vb, b.df)])
        half = critical(df) * math.sqrt(va + vb) if df > 0 else 0.0
        center = math.log(a.mean / b.mean)
        what = (f"unpaired ratio of means: delta method on the log scale, Welch df {df:.1f} "
                f"({a.n} vs {b.n} {level})")
        if level == "value":
            what = "one value on each side: no interval"
        units = (math.exp(center),) if level == "value" else ()
        return Interval(n, math.exp(center), math.exp(center - half), math.exp(center + half), *spread,
                        units, level, what, df or None, single, True, excluded)
    r = a.mean / b.mean
    va, vb = a.var / b.mean ** 2, r * r * b.var / b.mean ** 2
    df = welch_df([(va, a.df), (vb, b.df)])
    half = critical(df) * math.sqrt(va + vb) if df > 0 else 0.0
    what = f"unpaired ratio of means: delta method, linear (a value is not positive), Welch df {df:.1f}"
    units = (r,) if level == "value" else ()
    return Interval(n, r, r - half, r + half, *spread, units, level, what, df or None, single, False, excluded)


# -- the plan's layout ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Place:
    """Where a point or server sits in the design."""

    launch: str
    block: int | None
    repeat: int = 1
    exchangeable: bool = True
    why: str = ""


@dataclass(frozen=True)
class Layout:
    """Point id / server id -> its place, read from a run's stored plan."""

    points: dict[str, Place] = field(default_factory=dict)
    servers: dict[str, Place] = field(default_factory=dict)
    budget_blocks: int | None = None  # the sequential budget's blocks; None: a fixed design
    first_look: int = 1  # blocks before the first look (the required blocks)
    during_run: bool = False  # read as the stopping rule read it during the run: no block set aside after it

    def point(self, point_id: str, server_id: str | None, repeat: int) -> Place:
        """The place of a point; without a plan entry its server is its launch, in an unknown block."""
        return self.points.get(point_id) or Place(server_id or point_id, None, repeat)

    def server(self, server_id: str, index: int) -> Place:
        return self.servers.get(server_id) or Place(server_id, None, index)

    def blocks(self, points: Sequence[Any]) -> set[int | None]:
        """The blocks stored points (`PointRecord`s) were measured in."""
        return {self.point(p.point_id, p.server_id, p.repeat).block for p in points}


def layout(plan: Plan | None) -> Layout:
    """The layout of a run's plan (`Plan.from_stored`; None: no readable plan, an empty layout)."""
    if plan is None:
        return Layout()
    points: dict[str, Place] = {}
    servers: dict[str, Place] = {}
    for launch in plan.launches:
        for k, sid in enumerate(launch.server_ids or (launch.id,), start=1):
            servers[sid] = Place(launch.id, launch.block, k)
        for p in launch.points:
            points[p.id] = Place(launch.id, launch.block, p.repeat, p.exchangeable, p.not_exchangeable_because)
    budget = plan.design.budget
    first = max(plan.design.launches.values(), default=1)
    return Layout(points, servers, budget.blocks if budget is not None and budget.blocks else None, first)

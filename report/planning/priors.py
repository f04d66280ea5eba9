"""The priors of decidability (report.planning.decidability) from stored runs: per metric, the spread between launches
and between repeats, pooled over every configuration of every run (across GPU, model and vLLM), with the
configurations whose spread is an outlier dropped. Read once here, handed on as typed `Prior`s.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from compiler.metrics import METRICS, SERVER_METRICS
from compiler.plan import Plan
from report.planning.block_planner import Spread, config_key, launch_configuration, pool
from report.planning.decidability import (
    DEFAULT_SPREADS,
    DEFAULTS_UNTIL,
    MODE_SETS,
    MODES,
    Family,
    Prior,
    Priors,
    default_prior,
    family,
    step_mode,
)
from report.stats.intervals import layout
from runner.store.store import Store

FENCE = 1.5  # Tukey's: a configuration whose log SD is this many IQRs past a quartile is an outlier

Groups = dict[tuple[str, tuple[object, ...]], dict[str, list[float]]]  # (metric, config) -> launch -> logs
# (metric, run, the point's shape without its server) -> server configuration -> block -> logs
Blocks = dict[tuple[str, str, tuple[object, ...]], dict[tuple[object, ...], dict[int, list[float]]]]


@dataclass
class Stored:
    """What the priors are computed from: log values by launch, and by block for the paired ratios."""

    launches: Groups = field(default_factory=dict)
    blocks: Blocks = field(default_factory=dict)

    def add(self, metric: str, config: tuple[object, ...], shape: tuple[object, ...], run: str, launch: str,
            block: int | None, value: object) -> None:
        if not isinstance(value, int | float) or isinstance(value, bool) or value <= 0 or metric not in METRICS:
            return
        log = math.log(value)
        self.launches.setdefault((metric, (*config, *shape)), {}).setdefault(f"{run}|{launch}", []).append(log)
        if block is not None:
            cell = self.blocks.setdefault((metric, run, shape), {}).setdefault(config, {})
            cell.setdefault(block, []).append(log)


def collect(db: Path, until: datetime | None = None) -> Stored:
    """The log values of exchangeable repeats of every ok, valid point of every run, by (metric,
    configuration on its GPU and vLLM version) and launch, and by block; of every server metric, one value
    a server. With `until`, only the runs started by then."""
    out = Stored()
    with Store(db, read_only=True) as store:
        for run in store.runs():
            if until is not None and (run.started_at is None or run.started_at > until):
                continue
            plan = Plan.from_stored(run.plan_json)
            if plan is None:
                continue
            where = (run.gpu_name, run.vllm_version)
            steps = {p.id: (launch, p) for launch in plan.launches for p in launch.points}
            places = layout(plan)
            for point in store.points(run.run_id):
                if point.status != "ok" or not point.valid or point.point_id not in steps:
                    continue
                place = places.point(point.point_id, point.server_id, point.repeat)
                if place.exchangeable:
                    key = config_key(*steps[point.point_id])
                    for name, value in vars(point.summary).items():
                        out.add(name, (*where, key[0]), key[1:], run.run_id, place.launch, place.block, value)
            configs = {launch.id: launch_configuration(launch) for launch in plan.launches}
            for server in store.servers(run.run_id):
                if server.status != "ready" or server.launch_id not in configs:
                    continue
                block = places.server(server.server_id, 1).block
                for name in SERVER_METRICS:
                    out.add(name, (*where, configs[server.launch_id]), (), run.run_id, server.server_id, block,
                            server.metric(name))
    return out


def mode(config: tuple[object, ...]) -> str:
    """The `step_mode` of a stored configuration ((GPU, vLLM, argv)), read from its argv as
    `compiler.plan.Engine.enforce_eager` is: an eager step is host-bound, and its time varies from launch to
    launch tens of times more than a graphed one's (roofline-h100's eager arm 15% at batch 1, its graphs
    arms 0.03-1.1%)."""
    argv = config[2] if len(config) > 2 else ()
    return step_mode(isinstance(argv, tuple) and "--enforce-eager" in argv)


PairKey = tuple[str, str, tuple[object, ...], tuple[str, ...]]  # metric, run, shape, the two sides' modes


def pairs(blocks: Blocks) -> list[tuple[PairKey, list[float]]]:
    """Per pair of server configurations measured at the same point shape in the same blocks of one run,
    ((metric, run, shape, the sorted set of the two configurations' `mode`s), the per-block log-ratios: a
    block's mean log of one less the other's), two blocks or more."""
    out: list[tuple[PairKey, list[float]]] = []
    for (metric, run, shape), configs in sorted(blocks.items(), key=lambda kv: repr(kv[0])):
        names = sorted(configs, key=repr)
        for i, top in enumerate(names):
            for bottom in names[i + 1:]:
                a, b = configs[top], configs[bottom]
                diffs = [math.fsum(a[k]) / len(a[k]) - math.fsum(b[k]) / len(b[k]) for k in sorted(set(a) & set(b))]
                if len(diffs) >= 2:
                    out.append(((metric, run, shape, tuple(sorted({mode(top), mode(bottom)}))), diffs))
    return out


@dataclass(frozen=True)
class Pooled:
    """A metric's (or family's) pooled spreads: between launches and repeats (`spread`), and of a paired
    block's log-ratio (`pair.within_sd`), with how many configurations and pairs went in and were dropped."""

    spread: Spread
    configs: int
    dropped: int
    pair: Spread | None = None
    pairs: int = 0
    pairs_dropped: int = 0


def outliers(sds: Sequence[float]) -> set[int]:
    """Indices of the positive SDs whose log lies outside Tukey's fences (the quartiles -/+ 1.5 times the
    interquartile range of the logs); none with fewer than four. An SD floored at 0 is kept: the fences are
    on the log scale, where it has no place, and dropping it would only raise the prior."""
    logs = {i: math.log(sd) for i, sd in enumerate(sds) if sd > 0}
    if len(logs) < 4:
        return set()
    q1, _, q3 = statistics.quantiles(logs.values(), n=4, method="inclusive")
    low, high = q1 - FENCE * (q3 - q1), q3 + FENCE * (q3 - q1)
    return {i for i, v in logs.items() if not low <= v <= high}


def kept(metric: str, groups: Iterable[dict[str, list[float]]]) -> tuple[list[dict[str, list[float]]], int]:
    """A metric's configurations less those whose launch-to-launch SD (report.planning.block_planner.pool) is an
    outlier (`outliers`), and how many were dropped."""
    groups = list(groups)
    spreads = [pool(metric, [g]) for g in groups]
    ran_twice = [i for i, s in enumerate(spreads) if s.launch_sd is not None]
    bad = {ran_twice[i] for i in outliers([spreads[i].launch_sd or 0.0 for i in ran_twice])}
    return [g for i, g in enumerate(groups) if i not in bad], len(bad)


def pool_parts(name: str, parts: Sequence[tuple[str, list[dict[str, list[float]]], list[list[float]]]]) -> Pooled:
    """Pool (metric, its configurations, its pairs) parts, outliers dropped within each metric."""
    launches: list[dict[str, list[float]]] = []
    diffs: list[dict[str, list[float]]] = []
    dropped = pair_dropped = configs = n_pairs = 0
    for metric, groups, found in parts:
        good, bad = kept(metric, groups)
        launches += good
        dropped, configs = dropped + bad, configs + len(groups)
        sds = [pool(metric, [{"pair": d}]).within_sd or 0.0 for d in found]
        out = outliers(sds)
        diffs += [{"pair": d} for i, d in enumerate(found) if i not in out]
        pair_dropped, n_pairs = pair_dropped + len(out), n_pairs + len(found)
    pair = pool(name, diffs) if diffs else None
    return Pooled(pool(name, launches), configs, dropped, pair if pair and pair.within_sd is not None else None,
                  n_pairs, pair_dropped)


Part = tuple[str, list[dict[str, list[float]]], list[list[float]]]  # metric, its configurations, its pairs


def similar(shape: tuple[object, ...]) -> tuple[object, ...]:
    """What makes two points' configurations similar across GPU, model, vLLM and engine: the workload's
    lengths and the load (report.planning.decidability.shape_of); a server metric's shape is ()."""
    return (*shape[:3], *shape[4:6]) if shape else ()


def _parts(stored: Stored) -> dict[str, Part]:
    """metric -> the part pooled for it: every configuration and pair, whatever their shape."""
    launches: dict[str, list[dict[str, list[float]]]] = {}
    for (metric, _), groups in stored.launches.items():
        launches.setdefault(metric, []).append(groups)
    found: dict[str, list[list[float]]] = {}
    for (metric, _, _, _), diffs in pairs(stored.blocks):
        found.setdefault(metric, []).append(diffs)
    return {m: (m, launches[m], found.get(m, [])) for m in sorted(launches)}


def similar_parts(stored: Stored) -> dict[tuple[str, tuple[object, ...]], Part]:
    """(metric, (modes, *similar shape)) -> the part pooled for it: a point metric's configurations whose
    `mode` is among `modes` (one of MODE_SETS: a hypothesis's sides' modes), and its pairs of exactly those
    modes, so that an eager configuration's spread does not reach a comparison of graphed ones; a server
    metric's part, (metric, ()), pools every configuration and pair as before."""
    launches: dict[tuple[str, tuple[object, ...], str], list[dict[str, list[float]]]] = {}
    for (metric, key), groups in stored.launches.items():
        launches.setdefault((metric, similar(key[3:]), mode(key)), []).append(groups)
    found: dict[tuple[str, tuple[object, ...], tuple[str, ...]], list[list[float]]] = {}
    for (metric, _, shape, modes), diffs in pairs(stored.blocks):
        found.setdefault((metric, similar(shape), modes if shape else ()), []).append(diffs)
    out: dict[tuple[str, tuple[object, ...]], Part] = {}
    for metric, shape in sorted({(m, s) for m, s, _ in launches}, key=repr):
        if not shape:  # a server metric: every configuration and pair, whatever their modes
            every = [g for md in MODES for g in launches.get((metric, (), md), [])]
            out[(metric, ())] = (metric, every, found.get((metric, (), ()), []))
            continue
        for modes in MODE_SETS:
            if all((metric, shape, md) in launches for md in modes):
                chosen = [g for md in modes for g in launches[(metric, shape, md)]]
                out[(metric, (modes, *shape))] = (metric, chosen, found.get((metric, shape, modes), []))
    return out


def metric_priors(stored: Stored) -> dict[str, Pooled]:
    """metric -> its spreads pooled over every configuration and pair, outliers dropped."""
    return {m: pool_parts(m, [part]) for m, part in _parts(stored).items()}


def family_priors(stored: Stored) -> dict[Family, Pooled]:
    """family -> the spreads pooled over every configuration and pair of every metric in it, each metric's
    outliers dropped (the defaults' computation, scripts/decidability_defaults.py)."""
    by_family: dict[Family, list[Part]] = {}
    for part in _parts(stored).values():
        by_family.setdefault(family(part[0]), []).append(part)
    return {f: pool_parts(f, found) for f, found in by_family.items()}


def to_prior(metric: str, pooled: Pooled, db: Path, what: str = "") -> Prior:
    """A pooled spread as a Prior; a part never measured (no configuration ran on two launches, one repeat a
    launch, no pair) takes its family's default, and the source says so."""
    s, fallback = pooled.spread, default_prior(metric)
    launch = s.launch_sd if s.launch_sd is not None else fallback.launch_sd
    within = s.within_sd if s.within_sd is not None else fallback.within_sd
    df = float(s.launch_df) if s.launch_sd is not None else fallback.df
    pair = pooled.pair
    source = (f"{db.name}{what}: {pooled.configs} configuration(s) ({pooled.dropped} dropped as outliers), "
              f"{pooled.pairs} pair(s) ({pooled.pairs_dropped} dropped)")
    if s.launch_sd is None:
        source += f"; launch part {fallback.source}"
    if pair is None:
        source += f"; paired part {fallback.source}"
    return Prior(metric, launch, within, df, source,
                 pair.within_sd if pair is not None else fallback.pair_sd,
                 float(pair.within_df) if pair is not None else fallback.pair_df)


def read_priors(db: Path) -> Priors:
    """The priors from the runs stored in `db`: per metric at each point shape and set of step modes (similar
    configurations, across GPU, model, vLLM and engine), and per metric over every shape."""
    stored = collect(db)
    by_shape = {(m, shape): to_prior(m, pool_parts(m, [part]), db, " (similar configurations)")
                for (m, shape), part in similar_parts(stored).items()}
    return Priors({m: to_prior(m, p, db) for m, p in metric_priors(stored).items()}, by_shape)


Row = tuple[Family, float | None, float | None, int, float | None, int, int, int]


def defaults_table(db: Path, until: datetime | None = DEFAULTS_UNTIL) -> list[Row]:
    """(family, launch SD, within SD, launch df, paired SD, paired df, configurations, pairs) per family, as
    the defaults are computed from `db`'s runs started by `until`."""
    found = family_priors(collect(db, until))
    return [(f, p.spread.launch_sd, p.spread.within_sd, p.spread.launch_df,
             p.pair.within_sd if p.pair else None, p.pair.within_df if p.pair else 0, p.configs, p.pairs)
            for f in DEFAULT_SPREADS if (p := found.get(f)) is not None]

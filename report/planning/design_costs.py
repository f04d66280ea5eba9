"""What the GPU-time planner (report.planning.cheapest_design) rests on, read from the earlier runs of the same study on
the same GPU and vLLM version (through runner.store): each configuration's spread between launches and
between repeats, and a point's wall from its stored phases; a launch's start (and stop) from its stored phases
or its servers' start time, in the newest run of any study on that GPU and version that started the same
configuration. Then the cheapest design per hypothesis and for the whole study.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from compiler.capacity import replay
from compiler.metrics import SERVER_METRICS
from compiler.plan import HypothesisStep, Launch, Plan, SearchStep, budget_points
from report.planning.block_planner import (
    BlockCosts,
    Cells,
    Group,
    Key,
    config_key,
    launch_configuration,
    paired_spread,
    pool,
)
from report.planning.cheapest_design import LIMITS, POWER, Components, Costs, Goal, Limits, Proposal, cheapest
from report.results import run_order, same_gpu
from report.scoring.capacity import launch_place, stored_probe_rows
from report.scoring.sides import compiled_apart
from report.stats.intervals import Layout, layout, welch_df
from runner.execute.segments import START
from runner.store.records import PointRecord, RunRecord, ServerRecord, base_server_id
from runner.store.store import Store


@dataclass
class Stored:
    """The earlier runs' measurements, by configuration: log values per launch and per block, point walls,
    and a launch's fixed seconds (start and stop) by engine configuration."""

    runs: list[str] = field(default_factory=list)
    version: str | None = None
    launches: Cells = field(default_factory=dict)
    blocks: Cells = field(default_factory=dict)
    point_s: dict[Key, list[float]] = field(default_factory=dict)
    start_s: dict[tuple[str, ...], list[float]] = field(default_factory=dict)
    start_run: dict[tuple[str, ...], str] = field(default_factory=dict)  # the run each configuration's starts are from
    start_from_servers: set[tuple[str, ...]] = field(default_factory=set)  # no phases stored: the servers' time
    elsewhere: tuple[str, ...] = ()  # the study's runs on other GPUs (`_elsewhere`)
    resolution: dict[Key, list[float]] = field(default_factory=dict)  # a search's log(failed / held), per launch


def read_stored(db: Path, study_id: str, hardware: str) -> Stored:
    """Every valid, exchangeable point and every launch's start of `study_id`'s runs on `hardware` (the newest
    run's vLLM version only)."""
    out = Stored()
    with Store(db, read_only=True) as store:
        every = sorted(store.runs(), key=run_order)
        out.elsewhere = _elsewhere(every, study_id, hardware)
        on_gpu = [r for r in every if same_gpu(r.gpu_name, hardware)]
        runs = [r for r in on_gpu if r.study_id == study_id]
        out.version = runs[-1].vllm_version if runs else None
        for run in (r for r in runs if r.vllm_version == out.version):
            plan = Plan.from_stored(run.plan_json)
            if plan is None:
                continue
            out.runs.append(run.run_id)
            launches = {launch.id: launch for launch in plan.launches}
            steps = {p.id: (launch, p) for launch in plan.launches for p in launch.points}
            places = layout(plan)
            points = store.points(run.run_id)
            for point in points:
                if point.status != "ok" or not point.valid or point.point_id not in steps:
                    continue
                key = config_key(*steps[point.point_id])
                if point.phases_json:
                    out.point_s.setdefault(key, []).append(math.fsum(json.loads(point.phases_json).values()))
                place = places.point(point.point_id, point.server_id, point.repeat)
                if not place.exchangeable:
                    continue
                for name, value in vars(point.summary).items():
                    if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
                        cell = (name, key)
                        out.launches.setdefault(cell, {}).setdefault(Group(run.run_id, place.launch), []).append(
                            math.log(value))
                        if place.block is not None:
                            out.blocks.setdefault(cell, {}).setdefault(Group(run.run_id, place.block), []).append(
                                math.log(value))
            _server_values(out, run.run_id, store.servers(run.run_id), launches, places)
            _search_values(out, run.run_id, points, plan, places)
        if out.runs:
            _read_starts(out, store, [r for r in on_gpu if r.vllm_version == out.version])
    return out


def _read_starts(out: Stored, store: Store, runs: Sequence[RunRecord]) -> None:
    """Each configuration's starts (and stops) in the newest of `runs` (oldest first) that started it, whatever
    its study: a start is the configuration's, not the study's, and the runner's starts got cheaper since many
    runs were stored (held starts, primed compile caches)."""
    for run in reversed(runs):
        plan = Plan.from_stored(run.plan_json)
        if plan is None:
            continue
        launches = {launch.id: launch for launch in plan.launches}
        got: dict[tuple[str, ...], list[float]] = {}
        _, phases = store.timing(run.run_id)
        fixed: dict[str, float] = {}
        for ph in phases:
            if ph.launch_id in launches and (ph.phase.startswith(START) or ph.phase == "stop"):
                fixed[ph.launch_id] = fixed.get(ph.launch_id, 0.0) + ph.seconds
        for lid, seconds in fixed.items():
            got.setdefault(launch_configuration(launches[lid]), []).append(seconds)
        if not fixed:
            places = layout(plan).servers
            for server in store.servers(run.run_id):
                at = places.get(base_server_id(server.server_id))
                if at is not None and at.launch in launches and server.startup_s:
                    got.setdefault(launch_configuration(launches[at.launch]), []).append(server.startup_s)
        for configuration, starts in got.items():
            if configuration not in out.start_s:
                out.start_s[configuration], out.start_run[configuration] = starts, run.run_id
                if not fixed:
                    out.start_from_servers.add(configuration)


def server_key(launch: Launch) -> Key:
    """A server metric's configuration: the launch's alone (`launch_configuration`)."""
    return ("server", launch_configuration(launch))


def _server_values(out: Stored, run_id: str, servers: Sequence[ServerRecord], launches: dict[str, Launch],
                   places: Layout) -> None:
    """Each server's own metrics, by launch and block; a start that compiled its graphs where the run's other
    starts loaded them is left out, as the scoring leaves it out (report.scoring.sides.COLD_COMPILE)."""
    warm_seen = any(s.compile_cache == "warm" for s in servers)
    for server in servers:
        at = places.servers.get(base_server_id(server.server_id))
        if at is None or at.launch not in launches:
            continue
        for name in SERVER_METRICS:
            if compiled_apart(server, name, warm_seen):
                continue
            value = server.metric(name)
            if value is not None and value > 0:
                cell = (name, server_key(launches[at.launch]))
                out.launches.setdefault(cell, {}).setdefault(Group(run_id, at.launch), []).append(math.log(value))
                if at.block is not None:
                    out.blocks.setdefault(cell, {}).setdefault(Group(run_id, at.block), []).append(math.log(value))


def search_key(launch: Launch, search: SearchStep) -> Key:
    """A capacity search's configuration: its launch's and its template point's, and the search's own range,
    probes, attainment and waves (the same search on another launch is the same configuration)."""
    return ("search", config_key(launch, search.template), search.over, search.lo, search.hi, search.probes,
            search.attainment, search.waves)


def _search_values(out: Stored, run_id: str, points: Sequence[PointRecord], plan: Plan, places: Layout) -> None:
    """Each resolved search's capacity (one value a launch), by launch and block, replayed from its stored probes
    as the scoring replays them (report.scoring.capacity), and its resolution: the log of the lowest level that failed
    over the capacity, by which the scoring widens the interval."""
    for launch in plan.launches:
        for search in launch.searches:
            result = replay(search, {r.level: r.held for r in stored_probe_rows(points, search)})[1]
            if result.status != "resolved" or not result.capacity or not result.failed:
                continue
            at = launch_place(places, launch.id)
            key = search_key(launch, search)
            value = [math.log(result.capacity)]
            out.launches.setdefault(("capacity", key), {})[Group(run_id, launch.id)] = value
            if at.block is not None:
                out.blocks.setdefault(("capacity", key), {})[Group(run_id, at.block)] = value
            out.resolution.setdefault(key, []).append(math.log(result.failed / result.capacity))


@dataclass(frozen=True)
class HypothesisDesign:
    """One hypothesis: what it was planned from, and the cheapest design (or why none)."""

    hypothesis: str
    proposal: Proposal
    components: Components | None = None
    costs: Costs | None = None
    goal: str = ""  # what deciding was taken to mean
    source: str = ""  # where the spread came from


@dataclass(frozen=True)
class GpuPlan:
    rows: tuple[HypothesisDesign, ...]
    study: Proposal  # one design for every hypothesis that has one
    study_costs: Costs | None
    runs: tuple[str, ...]
    version: str | None
    assumed: tuple[str, ...]
    limits: Limits = LIMITS
    hardware: str = ""  # the study's GPU, which the runs above ran on
    elsewhere: tuple[str, ...] = ()  # where no run did: "GPU: run, run" of the study's runs on other GPUs


def _components(stored: Stored, hyp: HypothesisStep, keys: Sequence[Key]) -> tuple[Components, str]:
    """The block's variance components: each side's launch and repeat parts added; for a ratio whose two
    configurations ran in the same blocks, the launch part is what their block ratios leave beyond repeats."""
    spreads = [pool(hyp.metric, [stored.launches.get((hyp.metric, k), {})]) for k in keys]
    launch = [((s.launch_sd or 0.0) ** 2, s.launch_df) for s in spreads]
    repeat = [((s.within_sd or 0.0) ** 2, s.within_df) for s in spreads]
    repeat_var = math.fsum(v for v, _ in repeat)
    repeat_df = welch_df(repeat) if repeat_var > 0 else float(min(df for _, df in repeat))
    launch_df = 0.0 if any(df == 0 for _, df in launch) else welch_df(launch) or float(min(df for _, df in launch))
    comp = Components(math.fsum(v for v, _ in launch), launch_df, repeat_var, repeat_df)
    source = "each side's launches and repeats, added"
    if len(keys) == 2:
        pair = paired_spread(stored.blocks, hyp.metric, keys[0], keys[1])
        if pair is not None:
            # what the stored block ratios' repeats put in them: each side's repeat variance over its repeats
            share = math.fsum(v / statistics.median(len(x) for x in stored.blocks[(hyp.metric, k)].values())
                              for (v, _), k in zip(repeat, keys, strict=True))
            comp = Components(max(pair.sd ** 2 - share, 0.0), pair.df, repeat_var, repeat_df)
            source = f"paired blocks ({pair.blocks}, df {pair.df}) beyond their repeats"
    if comp.repeat_df == 0 and comp.launch_df and hyp.level not in ("server", "search"):
        source += "; repeats not measured apart (one a launch): all of it taken as between launches"
    return comp, source


def _goal(hyp: HypothesisStep, distance: float | None) -> tuple[Goal | None, str]:
    if distance is not None and distance > 0:
        return Goal(distance), f"the truth where the last run measured it, {100 * distance:.3g}% from its edge"
    pred = hyp.prediction
    if pred.kind == "value" and pred.band:
        return Goal(math.log1p(float(pred.band)), inside=True), f"the truth at the prediction, band ±{pred.band:.3g}"
    return None, "no earlier estimate and no band around the prediction"


def _costs(stored: Stored, launches: Sequence[Launch], points: Sequence[set[Key]], assumed: set[str]) -> Costs:
    """A block's starts (and stops) and capacity searches, and one repeat of `points` (per launch), from the
    medians stored; the plan's estimates where nothing was (a search's always: its probes are not stored
    apart)."""
    start = 0.0
    for launch in launches:
        got = stored.start_s.get(launch_configuration(launch))
        if got:
            start += statistics.median(got)
        else:
            start += launch.estimated_start_s
            assumed.add("a start never stored is the plan's estimate")
        if launch.searches:  # once a launch, after its points: a block's cost, as its start is
            start += sum(q.estimated_s for q in launch.searches)
            assumed.add("a capacity search is the plan's estimate of its probes")
    point = 0.0
    for launch, keys in zip(launches, points, strict=True):
        for p, key in ((p, config_key(launch, p)) for p in launch.points if p.repeat == 1):
            if key not in keys:
                continue
            got = stored.point_s.get(key)
            if got:
                point += statistics.median(got)
            else:
                point += p.estimated_s
                assumed.add("a point never stored is the plan's estimate")
    return Costs(start, point)


SEARCH_NOT_PLANNED = "no stored search of it resolved: no capacity spread to plan from"


def _resolved(stored: Stored, keys: Sequence[Key], goal: Goal | None, meaning: str,
              source: str) -> tuple[Goal | None, str, str]:
    """A capacity's goal less its searches' resolution: the scoring widens the interval to the lowest levels
    that failed (report.scoring.capacity), so the launches must decide it that much closer to the truth. The widest
    side's median resolution is taken off (a ratio's lower end is widened by one side's, its upper by the
    other's)."""
    got = [stored.resolution[k] for k in keys if k in stored.resolution]
    if len(got) < len(keys):
        return None, SEARCH_NOT_PLANNED, source
    res = max(statistics.median(r) for r in got)
    source += f"; the searches' resolution (lowest level that failed over the capacity) {100 * math.expm1(res):.3g}%"
    if goal is None:
        return goal, meaning, source
    if goal.distance <= res:
        return None, (f"{meaning}: within the searches' resolution ({100 * math.expm1(res):.3g}%): more probes, "
                      f"not more launches"), source
    return Goal(goal.distance - res, goal.inside, goal.power), f"{meaning}, less the searches' resolution", source


def gpu_plan(plan: Plan, db: Path, distances: dict[str, float] | None = None, limits: Limits = LIMITS) -> GpuPlan:
    """Per hypothesis of `plan` (point, server and capacity metrics), the cheapest launches x repeats from `db`;
    `distances`: a hypothesis' last measured distance to its edge (log scale), the goal where given."""
    stored = read_stored(db, plan.study_id, plan.hardware)
    if not stored.runs:
        return GpuPlan(tuple(HypothesisDesign(h.id, Proposal(None, "no earlier run of this study on this GPU"))
                             for h in plan.hypotheses), Proposal(None, "no hypothesis has a design"), None, (), None,
                       (), limits, plan.hardware, stored.elsewhere)
    assumed: set[str] = set()
    first = [launch for launch in plan.launches if launch.block == 1]
    rows: list[HypothesisDesign] = []
    together = []
    for hyp in plan.hypotheses:
        sides = [s for s in (hyp.numerator, hyp.denominator) if s is not None]
        if hyp.level == "search":  # one capacity a launch: repeats buy nothing, as for a server metric
            searches = {q.id: (launch, q) for launch in plan.launches for q in launch.searches}
            keys = [search_key(*searches[s.points[0]]) for s in sides]
        elif hyp.level == "server":  # one value per start: repeats buy nothing (none is measured apart)
            assumed.add("a server metric's every start loads its compiled graphs (one that compiles them is left "
                        "out of it, so count the first start on a cold cache as extra)")
            by_id = {launch.id: launch for launch in plan.launches}
            keys = [server_key(by_id[s.launches[0]]) for s in sides]
        else:
            steps = {p.id: (launch, p) for launch in plan.launches for p in launch.points}
            keys = [config_key(*steps[s.points[0]]) for s in sides]
        goal, meaning = _goal(hyp, (distances or {}).get(hyp.id))
        comp, source = _components(stored, hyp, keys)
        if hyp.level == "search":
            goal, meaning, source = _resolved(stored, keys, goal, meaning, source)
        used = [launch for launch in first if budget_points(launch, [hyp]) or launch.searches]
        trimmed = [{config_key(launch, p) for p in budget_points(launch, [hyp])} for launch in used]
        costs = _costs(stored, used, trimmed, assumed)
        if goal is None:
            rows.append(HypothesisDesign(hyp.id, Proposal(None, meaning), comp, costs, meaning, source))
            continue
        proposal = cheapest([(comp, goal)], costs, limits)
        rows.append(HypothesisDesign(hyp.id, proposal, comp, costs, meaning, source))
        if proposal.design is not None:
            together.append((comp, goal))
    every = [{config_key(launch, p) for p in launch.points} for launch in first]
    study_costs = _costs(stored, first, every, assumed)
    study = cheapest(together, study_costs, limits) if together else Proposal(None, "no hypothesis has a design")
    if any(stored.start_run.get(launch_configuration(launch)) not in (None, *stored.runs) for launch in first):
        assumed.add("a start from another study's run where that one is newer and started the same configuration")
    if any(launch_configuration(launch) in stored.start_from_servers for launch in first):
        assumed.add("some starts from the servers' stored start time (no phases stored): their stop is left out")
    return GpuPlan(tuple(rows), study, study_costs, tuple(stored.runs), stored.version, tuple(sorted(assumed)),
                   limits, plan.hardware)


def block_costs(gpu: GpuPlan, repeats: int) -> BlockCosts | None:
    """The stored runs' GPU-seconds of a block of `repeats` repeats, for the block planner's power plan: every
    point of a required block, each hypothesis' own points in a budget block (None: no run stored)."""
    if gpu.study_costs is None:
        return None
    return BlockCosts(gpu.study_costs.start_s + repeats * gpu.study_costs.point_s,
                      {row.hypothesis: row.costs.start_s + repeats * row.costs.point_s
                       for row in gpu.rows if row.costs is not None})


def _elsewhere(runs: Sequence[RunRecord], study_id: str, hardware: str) -> tuple[str, ...]:
    """`study_id`'s runs (oldest first) on GPUs other than `hardware`, a "GPU: run, run" line per GPU: the planner
    leaves them out (their spreads and start costs are another GPU's), and says so."""
    by_gpu: dict[str, list[str]] = {}
    for run in runs:
        if run.study_id == study_id and not same_gpu(run.gpu_name, hardware):
            by_gpu.setdefault(run.gpu_name or "an unrecorded GPU", []).append(run.run_id)
    return tuple(f"{gpu}: {', '.join(ids)}" for gpu, ids in by_gpu.items())


NEEDS = ("it needs an earlier run of this study on this GPU with at least 2 launches per arm (the spread between "
         "launches) and, for its costs, its phases or its servers' start times")


def _design(p: Proposal, costs: Costs | None) -> str:
    d = p.design
    if d is None:
        return f"cannot plan: {p.why_not}"
    per = f" (a block: {costs.start_s:,.0f} s of starts and stops + {costs.point_s:,.1f} s a repeat)" if costs else ""
    return (f"{d.launches} launches per arm x {d.repeats} repeat{'s' if d.repeats > 1 else ''}, 1 block per launch: "
            f"{d.gpu_s:,.0f} GPU-s{per}, {d.power:.0%} power")


def format_gpu_plan(got: GpuPlan, study_id: str, db: Path) -> str:
    """The proposal as text lines, with what it assumed."""
    if not got.runs:
        text = f"GPU time to a decision: no earlier run of {study_id} on this GPU in {db}: {NEEDS}\n"
        if got.elsewhere:
            text += (f"  runs on a GPU other than the study's {got.hardware}, left out (their spreads and start "
                     f"costs are that GPU's): {'; '.join(got.elsewhere)}\n")
        return text
    out = [f"GPU time to a decision, from {len(got.runs)} earlier run(s) of {study_id} in {db} (vLLM "
           f"{got.version or 'unknown'}: {', '.join(got.runs)}):",
           f"  whole study: {_design(got.study, got.study_costs)}"]
    for r in got.rows:
        out.append(f"  {r.hypothesis}: {_design(r.proposal, r.costs)}")
        if r.components is not None:
            c = r.components
            launch = f"{100 * math.sqrt(c.launch_var):.2g}% (df {c.launch_df:.3g})" if c.launch_df else "not measured"
            repeat = f"{100 * math.sqrt(c.repeat_var):.2g}% (df {c.repeat_df:.3g})" if c.repeat_df else "not measured"
            out.append(f"    spread between launches {launch}, between repeats {repeat} ({r.source}); "
                       f"deciding: {r.goal}")
    told = [f"one block per launch (arms swapped inside a launch are not built); the interval between launches "
            f"at 95%, a fixed design; {POWER:.0%} power with the block SD at its 80% upper confidence bound; a block "
            f"costs every arm's start and stop (the median in the newest run, of any study on this GPU and vLLM "
            f"version, that started the configuration; a run's primes and calibration not counted) and a repeat the "
            f"median wall of its points (warmup, reset, measure, judge); at most {got.limits.launches} launches per arm and "
            f"{got.limits.repeats} repeats", *got.assumed]
    out += ["  assumed: " + "; ".join(told)]
    return "\n".join(out) + "\n"

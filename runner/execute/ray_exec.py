"""Launches on a Ray cluster (`studyc run --ray [ADDRESS]`): each launch (its servers and its load
generator) runs in a Ray actor that reserves the launch's GPUs; a launch of several GPUs (replicas or
tensor parallelism) reserves them as one placement group bundle, STRICT_PACK, so its servers share a
node. The actor runs `runner.execute.launch.run_launch` and streams its events back as they happen (a Ray
streaming generator); the driver (this process) is the only one that writes the database.

Turns as on one host: a launch of block b is dispatched once every launch of the blocks before b has
started. Ray places each on a node with free GPUs; a launch waits in Ray's queue until one is free.

A lost worker (its process killed, its node gone): the point in flight is recorded failed (like any
failed point: the run stops unless --keep-going); the points it had committed are kept; the rest of
that launch is dispatched once more on a fresh actor (a new server start under "<id>~2", wherever Ray
finds GPUs).
Lost a second time, the rest is left for `--resume`. The servers a lost worker started are stopped by
a small reaper process it left beside them (the node itself gone, they are gone with it).

Interference, once per run, as on one host (`runner.execute.parallel`): the first launch runs alone until its
first point has been measured twice more; then the others are dispatched, and the first measures once
more as soon as another launch starts measuring on the same node (launches on other nodes share nothing
with it). No launch beside it on its node within the wait, or a measurement missing: the rest of the
run goes one launch at a time, dispatched in plan order as each finishes.
Ray is imported only here and only when asked for: the base install does not need it.
"""

from __future__ import annotations

import os
import queue
import threading
from contextlib import suppress
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from base.errors import EngineError, StudycError
from compiler.plan import PointStep
from runner.execute.driver import Driver, RunOptions, drain, fresh_server_ids, run_phases
from runner.execute.launch import (
    Event,
    LaunchSpec,
    PointEvent,
    PointStartEvent,
    ServerEvent,
    StartedEvent,
    point_owner,
)
from runner.execute.parallel import interference_result, interference_state, record_interference
from runner.execute.point import PointOutcome
from runner.execute.ray_gate import Gate
from runner.execute.ray_worker import Alone, Beside, End, LaunchWorker, Node
from runner.store.records import ServerRecord

LOCAL = "local"  # --ray without an address: start a Ray cluster on this host
MISSING = "studyc run --ray needs Ray, which is not installed: pip install 'studyc[ray]'"
RETRIES = 1  # a launch whose worker is lost is dispatched this many more times
STOP_WAIT_S = 60.0


def require_ray() -> Any:
    """The ray module, or a StudycError saying how to install it."""
    try:
        import ray  # optional (studyc[ray]): imported only when --ray asks for it
    except ImportError:
        raise StudycError(MISSING) from None
    return ray


def connect(address: str, devices: int) -> tuple[Any, bool]:
    """Join the cluster at `address`, or (LOCAL) start one here with `devices` logical GPUs. Returns
    (ray, started_here). A local cluster gets no dashboard, and 127.0.0.1 as its node address."""
    ray = require_ray()
    if ray.is_initialized():
        return ray, False
    common: dict[str, Any] = {"log_to_driver": False, "configure_logging": False}
    if address != LOCAL:
        ray.init(address=address, **common)
        return ray, False
    ray.init(num_gpus=devices, num_cpus=os.cpu_count() or 1, include_dashboard=False,
             dashboard_host="127.0.0.1", _node_ip_address="127.0.0.1", **common)
    return ray, True


@dataclass
class _Follow:
    """What the driver knows of one dispatched launch (its follower thread writes what it streams)."""

    index: int
    spec: LaunchSpec
    attempt: int
    actor: Any = None
    group: Any = None
    in_flight: PointStep | None = None  # the point started and not yet emitted
    node: str | None = None  # the Ray node its actor runs on
    emitted: set[str] = field(default_factory=set)
    servers: dict[str, ServerRecord] = field(default_factory=dict)  # server_id -> latest record

    def note(self, event: Event | Alone | Beside) -> None:
        """Keep what a loss needs: the point in flight, the points emitted, each server's record."""
        match event:
            case PointStartEvent(point=point):
                self.in_flight = point
            case PointEvent(outcome=outcome):
                self.emitted.add(outcome.point.id)
                self.in_flight = None
            case ServerEvent(record=record):
                self.servers[record.server_id] = record


# What the follower threads put on the driver's queue, besides the launch's own events and the
# interference measurements (`Alone`, `Beside`) they forward as streamed.
@dataclass(frozen=True)
class LaunchEnded:
    """The launch streamed its end: how `run_launch` ended on the worker."""

    follow: _Follow
    end: End


@dataclass(frozen=True)
class WorkerLost:
    """The launch's worker is gone (a Ray error, or its stream ended without an end)."""

    follow: _Follow
    why: str


@dataclass(frozen=True)
class FollowFailed:
    """Following the launch raised something else: the driver thread re-raises it."""

    error: BaseException


Item = Event | Alone | Beside | LaunchEnded | WorkerLost | FollowFailed


def run_ray(specs: list[LaunchSpec], driver: Driver, options: RunOptions, devices: int) -> None:
    """Run the wanted launches as Ray actors, budget blocks after what they depend on
    (`runner.execute.driver.run_phases`); returns when all are done. A failed point or server without
    --keep-going, and Ctrl-C, stop every launch (their servers too), then propagate."""
    ray, started_here = connect(options.ray or LOCAL, devices)
    wait_s = options.startup_timeout_s + 60.0
    try:
        run_phases(specs, driver, lambda some: _run(ray, some, driver, wait_s))
    finally:
        if started_here:
            ray.shutdown()


def _run(ray: Any, specs: list[LaunchSpec], driver: Driver, wait_s: float) -> None:
    if not specs:
        return
    have = float(ray.cluster_resources().get("GPU", 0))
    need = max(s.launch.gpus for s in specs)
    if need > have:
        raise StudycError(f"the Ray cluster has {have:g} GPU(s); a launch of this study needs {need} "
                          "(start it with more, or with --ray and no address: --gpus names the logical devices)")
    on_cluster = _OnCluster(ray, specs, driver, wait_s, _gate(driver, specs, have))
    driver.progress.message(f"Ray: {have:g} GPU(s) in the cluster; {len(specs)} launch(es) to run")
    on_cluster.run()


def _gate(driver: Driver, specs: list[LaunchSpec], have: float) -> Gate:
    """The dispatch gate; interference is measured only where two launches can hold GPUs at once."""
    two = len(specs) > 1 and have >= specs[0].launch.gpus + min(s.launch.gpus for s in specs[1:])
    to_measure, sequential = interference_state(driver)
    return Gate(list(range(len(specs))), {i: s.launch.block for i, s in enumerate(specs)},
                0 if two and to_measure else None, sequential=sequential)


class _OnCluster:
    """One executor call on the cluster: a follower thread per dispatched launch streams its actor's
    items into `events`; the driver thread (`run`) takes them one at a time, in order."""

    def __init__(self, ray: Any, specs: list[LaunchSpec], driver: Driver, wait_s: float, gate: Gate) -> None:
        self.ray, self.specs, self.driver, self.wait_s, self.gate = ray, specs, driver, wait_s, gate
        self.worker = ray.remote(LaunchWorker)
        self.events: queue.Queue[Item] = queue.Queue()
        self.alone: list[Alone] = []
        self.live: dict[int, _Follow] = {}
        self.lock = threading.Lock()

    def run(self) -> None:
        """Dispatch, then handle what the launches stream until none is live. Anything raised stops
        every launch and commits the completed points still queued, then propagates."""
        self.dispatch_ready()
        try:
            while self.live:
                self.handle(self.events.get())
        except BaseException:
            self.stop()
            drain(self.events, self.driver, lambda item: item)
            raise

    def handle(self, item: Item) -> None:
        match item:
            case StartedEvent():
                self.on_started(item)
                self.driver.handle(item)
            case Alone():
                self.on_alone(item)
            case Beside():
                self.on_beside(item)
            case LaunchEnded():
                self.on_ended(item)
            case WorkerLost():
                self.on_lost(item)
            case FollowFailed(error=error):
                raise error
            case _:
                self.driver.handle(item)

    def on_started(self, started: StartedEvent) -> None:
        i = _index(self.live, started.launch.id)
        if self.gate.on_started(i, self.live[i].node) is not None:
            self.tell_first(True)
        self.advance()

    def on_alone(self, alone: Alone) -> None:
        self.alone.append(alone)
        self.gate.measured_alone()
        self.dispatch_ready()

    def on_beside(self, beside: Beside) -> None:
        gate, first = self.gate, self.alone[0]
        beside_id = self.specs[gate.beside].launch.id if gate.beside is not None and beside.beside is not None else None
        found = interference_result(first.point_id, list(first.alone), beside.beside, beside_id)
        gate.measured(record_interference(self.driver, found))

    def on_ended(self, ended: LaunchEnded) -> None:
        f, end = ended.follow, ended.end
        self.finish(f)
        self.gate.on_ended(f.index)
        self.advance()
        if end.kind == "server":
            self.driver.server_failed(f.spec.launch, EngineError(end.message))
        elif end.kind == "error":
            raise StudycError(f"launch {f.spec.launch.id} on Ray: {end.message}")

    def on_lost(self, lost: WorkerLost) -> None:
        """Record the loss; dispatch the launch's rest once more on a fresh actor while it has retries."""
        f = lost.follow
        self.finish(f)
        rest = _lost(self.driver, f, lost.why)
        self.gate.on_ended(f.index, again=bool(rest))
        if rest:
            self.dispatch(f.index, replace(f.spec, points=rest, server_ids=_fresh_ids(self.driver, f.spec)),
                          f.attempt + 1)
        self.advance()

    def advance(self) -> None:
        """Dispatch what the gate lets go; tell the first launch once none can start beside it."""
        self.dispatch_ready()
        if self.gate.give_up():
            self.tell_first(False)

    def dispatch_ready(self) -> None:
        for i in self.gate.to_dispatch():
            self.dispatch(i, self.specs[i], 0)

    def dispatch(self, i: int, spec: LaunchSpec, attempt: int) -> None:
        f = _Follow(i, spec, attempt)
        with self.lock:
            self.live[i] = f
        threading.Thread(target=self.follow, args=(f,), name=f"studyc-ray-{i}", daemon=True).start()

    def finish(self, f: _Follow) -> None:
        with self.lock:
            if self.live.get(f.index) is f:
                del self.live[f.index]

    def stop(self) -> None:
        """Stop every live launch: ask each actor to stop its servers, then end the actors."""
        with self.lock:
            follows = list(self.live.values())
        waits = []
        for f in follows:
            if f.actor is not None:
                with suppress(Exception):
                    waits.append(f.actor.stop.remote())
        if waits:
            with suppress(Exception):
                self.ray.wait(waits, num_returns=len(waits), timeout=STOP_WAIT_S)
        for f in follows:  # again: an actor may have started during the wait
            if f.actor is not None:
                with suppress(Exception):
                    self.ray.kill(f.actor)

    def tell_first(self, measure: bool) -> None:
        """Tell the interference launch that another started beside it (`measure`), or that none can."""
        first = self.live.get(self.gate.first) if self.gate.first is not None else None
        if first is not None and first.actor is not None:
            first.actor.beside_started.remote(measure)

    def follow(self, f: _Follow) -> None:
        """A follower thread: start the launch's actor, stream its items into the queue, end the actor."""
        try:
            self.place(f)
            self.stream(f)
        except self.ray.exceptions.RayError as exc:
            self.events.put(WorkerLost(f, f"{type(exc).__name__}: {_first_line(exc)}"))
        except BaseException as exc:
            self.events.put(FollowFailed(exc))
        finally:
            self.release(f)

    def place(self, f: _Follow) -> None:
        """Start the launch's actor on its GPUs: several as one STRICT_PACK bundle, so they share a node."""
        # optional: see require_ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        launch = f.spec.launch
        opts: dict[str, Any] = {"num_gpus": launch.gpus, "num_cpus": 0, "max_restarts": 0, "max_concurrency": 3}
        if launch.gpus > 1 or launch.replicas > 1:
            f.group = placement_group([{"GPU": float(launch.gpus)}], strategy="STRICT_PACK")
            opts["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                placement_group=f.group, placement_group_bundle_index=0)
        f.actor = self.worker.options(**opts).remote()

    def stream(self, f: _Follow) -> None:
        """Forward what the actor streams until its end; the first attempt of the first launch measures
        interference."""
        measures = f.index == self.gate.first and f.attempt == 0
        stream = f.actor.run.options(num_returns="streaming").remote(f.spec, self.wait_s if measures else None)
        for ref in stream:
            item = self.ray.get(ref)
            match item:
                case End():
                    self.events.put(LaunchEnded(f, item))
                    return
                case Node(node_id=node_id):
                    f.node = node_id
                case _:
                    f.note(item)
                    self.events.put(item)
        self.events.put(WorkerLost(f, "the launch's stream ended without its end"))

    def release(self, f: _Follow) -> None:
        if f.actor is not None:
            self.ray.kill(f.actor)
        if f.group is not None:
            from ray.util.placement_group import remove_placement_group  # optional: see require_ray

            remove_placement_group(f.group)


def _fresh_ids(driver: Driver, spec: LaunchSpec) -> tuple[str, ...]:
    """The fresh worker's server ids ("<id>~2", as a resumed launch's): the lost servers keep their rows
    and logs, and each point names the start that measured it."""
    return fresh_server_ids(spec.launch, {s.server_id for s in driver.store.servers(driver.run_id)})


def _index(live: dict[int, _Follow], launch_id: str) -> int:
    return next(i for i, f in live.items() if f.spec.launch.id == launch_id)


def _lost(driver: Driver, f: _Follow, why: str) -> tuple[PointStep, ...]:
    """Record the loss: servers that were up marked failed, the point in flight failed. Returns the
    points to dispatch again (none once the launch is out of retries)."""
    launch = f.spec.launch
    now = datetime.now(UTC)
    message = f"Ray worker lost: {why}"
    for record in f.servers.values():
        if record.status == "ready":
            driver.store.record_server(replace(record, status="failed", error=message, stopped_at=now))
    rest = tuple(p for p in f.spec.points if p.id not in f.emitted and (f.in_flight is None or p.id != f.in_flight.id))
    again = bool(rest) and f.attempt < RETRIES
    driver.progress.message(
        f"launch {launch.id}: {message}"
        + (f"; its {len(rest)} remaining point(s) go to a fresh worker" if again else "")
        + (f"; {len(rest)} point(s) left for --resume" if rest and not again else ""))
    if f.in_flight is not None:
        outcome = PointOutcome(point=f.in_flight, status="failed", error=f"{message} (during this point)",
                               started_at=now)
        device = ";".join(",".join(ds) for ds in f.spec.placement.server_devices)
        driver.handle(PointEvent(launch, outcome, point_owner(f.spec), device, ""))
    if not again and rest:
        driver.report.points_failed.extend(p.id for p in rest)
    return rest if again else ()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__

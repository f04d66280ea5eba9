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
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from base.errors import EngineError, StudycError
from runner.execute.driver import Driver, RunOptions, drain, fresh_server_ids, run_phases
from runner.execute.launch import (
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
    """What the driver knows of one dispatched launch."""

    index: int
    spec: LaunchSpec
    attempt: int
    actor: Any = None
    group: Any = None
    in_flight: Any = None  # the PointStep started and not yet emitted
    node: str | None = None  # the Ray node its actor runs on
    emitted: set[str] = field(default_factory=set)
    servers: dict[str, Any] = field(default_factory=dict)  # server_id -> latest ServerRecord


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
    # optional: see require_ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    if not specs:
        return
    have = float(ray.cluster_resources().get("GPU", 0))
    need = max(s.launch.gpus for s in specs)
    if need > have:
        raise StudycError(f"the Ray cluster has {have:g} GPU(s); a launch of this study needs {need} "
                          "(start it with more, or with --ray and no address: --gpus names the logical devices)")
    worker = ray.remote(LaunchWorker)
    events: queue.Queue[tuple[str, Any]] = queue.Queue()
    # Interference is measured only where two launches can hold GPUs at once.
    two = len(specs) > 1 and have >= specs[0].launch.gpus + min(s.launch.gpus for s in specs[1:])
    to_measure, sequential = interference_state(driver)
    gate = Gate(list(range(len(specs))), {i: s.launch.block for i, s in enumerate(specs)}, 0 if two and to_measure else None,
                sequential=sequential)
    alone: list[Alone] = []
    live: dict[int, _Follow] = {}
    lock = threading.Lock()
    driver.progress.message(f"Ray: {have:g} GPU(s) in the cluster; {len(specs)} launch(es) to run")

    def follow(f: _Follow) -> None:
        launch = f.spec.launch
        try:
            opts: dict[str, Any] = {"num_gpus": launch.gpus, "num_cpus": 0, "max_restarts": 0,
                                    "max_concurrency": 3}
            if launch.gpus > 1 or launch.replicas > 1:
                f.group = placement_group([{"GPU": float(launch.gpus)}], strategy="STRICT_PACK")
                opts["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                    placement_group=f.group, placement_group_bundle_index=0)
            f.actor = worker.options(**opts).remote()
            measures = f.index == gate.first and f.attempt == 0
            stream = f.actor.run.options(num_returns="streaming").remote(f.spec, wait_s if measures else None)
            for ref in stream:
                item = ray.get(ref)
                if isinstance(item, End):
                    events.put(("end", (f, item)))
                    return
                if isinstance(item, Node):
                    f.node = item.node_id
                    continue
                if isinstance(item, (Alone, Beside)):
                    events.put(("gate", item))
                    continue
                if isinstance(item, PointStartEvent):
                    f.in_flight = item.point
                elif isinstance(item, PointEvent):
                    f.emitted.add(item.outcome.point.id)
                    f.in_flight = None
                elif isinstance(item, ServerEvent):
                    f.servers[item.record.server_id] = item.record
                events.put(("event", item))
            events.put(("lost", (f, "the launch's stream ended without its end")))
        except ray.exceptions.RayError as exc:
            events.put(("lost", (f, f"{type(exc).__name__}: {_first_line(exc)}")))
        except BaseException as exc:
            events.put(("error", exc))
        finally:
            if f.actor is not None:
                ray.kill(f.actor)
            if f.group is not None:
                remove_placement_group(f.group)

    def dispatch(i: int, spec: LaunchSpec, attempt: int) -> None:
        f = _Follow(i, spec, attempt)
        with lock:
            live[i] = f
        threading.Thread(target=follow, args=(f,), name=f"studyc-ray-{i}", daemon=True).start()

    def dispatch_ready() -> None:
        for i in gate.to_dispatch():
            dispatch(i, specs[i], 0)

    def tell_first(measure: bool) -> None:
        first = live.get(gate.first) if gate.first is not None else None
        if first is not None and first.actor is not None:
            first.actor.beside_started.remote(measure)

    def on_gate(item: Alone | Beside) -> None:
        if isinstance(item, Alone):
            alone.append(item)
            gate.measured_alone()
            dispatch_ready()
            return
        beside_id = specs[gate.beside].launch.id if gate.beside is not None and item.beside is not None else None
        found = interference_result(alone[0].point_id, list(alone[0].alone), item.beside, beside_id)
        gate.measured(record_interference(driver, found))

    dispatch_ready()
    try:
        while live:
            kind, payload = events.get()
            if kind == "event":
                if isinstance(payload, StartedEvent):
                    i = _index(live, payload.launch.id)
                    if gate.on_started(i, live[i].node) is not None:
                        tell_first(True)
                    dispatch_ready()
                    if gate.give_up():
                        tell_first(False)
                driver.handle(payload)
            elif kind == "gate":
                on_gate(payload)
            elif kind == "end":
                f, end = payload
                _finish(live, lock, f)
                gate.on_ended(f.index)
                dispatch_ready()
                if gate.give_up():
                    tell_first(False)
                if end.kind == "server":
                    driver.server_failed(f.spec.launch, EngineError(end.message))
                elif end.kind == "error":
                    raise StudycError(f"launch {f.spec.launch.id} on Ray: {end.message}")
            elif kind == "lost":
                f, why = payload
                _finish(live, lock, f)
                rest = _lost(driver, f, why)
                gate.on_ended(f.index, again=bool(rest))
                if rest:
                    dispatch(f.index, replace(f.spec, points=rest, server_ids=_fresh_ids(driver, f.spec)),
                             f.attempt + 1)
                dispatch_ready()
                if gate.give_up():
                    tell_first(False)
            elif kind == "error":
                raise payload
    except BaseException:
        _stop(ray, live, lock)
        drain(events, driver)
        raise


def _fresh_ids(driver: Driver, spec: LaunchSpec) -> tuple[str, ...]:
    """The fresh worker's server ids ("<id>~2", as a resumed launch's): the lost servers keep their rows
    and logs, and each point names the start that measured it."""
    return fresh_server_ids(spec.launch, {s.server_id for s in driver.store.servers(driver.run_id)})


def _index(live: dict[int, _Follow], launch_id: str) -> int:
    return next(i for i, f in live.items() if f.spec.launch.id == launch_id)


def _finish(live: dict[int, _Follow], lock: threading.Lock, f: _Follow) -> None:
    with lock:
        if live.get(f.index) is f:
            del live[f.index]


def _lost(driver: Driver, f: _Follow, why: str) -> tuple[Any, ...]:
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


def _stop(ray: Any, live: dict[int, _Follow], lock: threading.Lock) -> None:
    """Stop every live launch: ask each actor to stop its servers, then end the actors."""
    with lock:
        follows = list(live.values())
    waits = []
    for f in follows:
        if f.actor is not None:
            try:
                waits.append(f.actor.stop.remote())
            except Exception:
                pass
    if waits:
        try:
            ray.wait(waits, num_returns=len(waits), timeout=STOP_WAIT_S)
        except Exception:
            pass
    for f in follows:
        if f.actor is not None:
            try:
                ray.kill(f.actor)
            except Exception:
                pass


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__

"""Launches on several device slots at once: a thread per slot runs its launches (plan order) with
`runner.execute.launch.run_launch`; every event goes through one queue to the driver thread, the only one
that writes the database.

Turns: a launch of block b starts once every launch of the blocks before b has started (blocks stay
together in time, so the arms of a block are measured side by side). After the interference gate
closes, a launch starts only once every launch before it in plan order has finished (one at a time).

Interference, once per run: the first launch's first point is measured twice more alone, right after
it ran (the point itself is left out: a launch's first point may run cold), then once more while
another launch measures beside it.
Rule: with a = the two alone output throughputs and b the one beside, the noise is |a1 - a2| / mean(a)
and the effect |b / mean(a) - 1|; launches keep running side by side only while the effect is at most
max(2 x noise, 1%). Above it, or when it cannot be measured, the rest of the run goes one launch at a
time (its devices still rotate).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any

from base import format as fmt
from base.errors import EngineError
from runner.execute.driver import Driver, RunOptions, drain
from runner.execute.launch import Cancel, LaunchSpec, StartedEvent, run_launch_retried
from runner.execute.point import PointOutcome

NOISE_FACTOR = 2.0
NOISE_FLOOR = 0.01
RULE = (f"parallel while |beside / mean(alone) - 1| <= max({NOISE_FACTOR:g} x |alone1 - alone2| / mean(alone), "
        f"{NOISE_FLOOR:.0%}) on output_throughput")


def interference_result(point_id: str, alone: list[float | None], beside: float | None,
                        beside_launch: str | None) -> dict[str, Any]:
    """The interference record (stored on the run as JSON) and the gate's decision."""
    out: dict[str, Any] = {"point": point_id, "metric": "output_throughput", "alone": alone, "beside": beside,
                           "beside_launch": beside_launch, "rule": RULE}
    if beside is None or any(a is None or a <= 0 for a in alone) or len(alone) != 2:
        out.update(noise=None, effect=None, threshold=None, parallel=False,
                   why="not measured (a measurement is missing): one launch at a time")
        return out
    a1, a2 = float(alone[0]), float(alone[1])  # type: ignore[arg-type]
    mean = (a1 + a2) / 2
    noise = abs(a1 - a2) / mean
    effect = abs(beside / mean - 1)
    threshold = max(NOISE_FACTOR * noise, NOISE_FLOOR)
    parallel = effect <= threshold
    out.update(noise=noise, effect=effect, threshold=threshold, parallel=parallel,
               why=("within the noise: launches keep running side by side" if parallel else
                    "exceeds the noise: the rest of the run goes one launch at a time"))
    return out


def interference_state(driver: Driver) -> tuple[bool, bool]:
    """(still to measure, one launch at a time). Interference is measured once per run, by the first
    executor call with two launches; a gate it closed keeps later calls (budget blocks) sequential."""
    measured = driver.report.interference
    return measured is None, measured is not None and not measured["parallel"]


def record_interference(driver: Driver, found: dict[str, Any]) -> bool:
    """Store the interference record on the run and say what the gate decided; True when launches
    may keep running side by side."""
    driver.report.interference = found
    driver.store_interference(found)
    if not found["parallel"]:
        driver.report.sequential_from = found["why"]
        effect = "not measured" if found["effect"] is None else fmt.percent(found["effect"])
        limit = "" if found["threshold"] is None else f" vs noise threshold {fmt.percent(found['threshold'])}"
        driver.progress.message(f"interference {effect}{limit}: {found['why']}")
        return False
    driver.progress.message(f"interference {fmt.percent(found['effect'])} within "
                            f"{fmt.percent(found['threshold'])}: launches keep running side by side")
    return True


def throughput(outcome: PointOutcome | None) -> float | None:
    if outcome is None or outcome.status != "ok" or outcome.judgement is None:
        return None
    return outcome.judgement.summary.output_throughput


class _Turns:
    def __init__(self, specs: list[LaunchSpec]) -> None:
        self.blocks = [s.launch.block for s in specs]
        n = len(specs)
        self.started = [False] * n
        self.finished = [False] * n
        self.sequential = False
        self.hold: int | None = None  # only this launch may start (interference: alone)
        self.cond = threading.Condition()
        self.cancelled = False

    def _ready(self, i: int) -> bool:
        if self.hold is not None and i != self.hold:
            return False
        if self.sequential:
            return all(self.finished[:i])
        return all(self.started[j] for j in range(i) if self.blocks[j] < self.blocks[i])

    def wait(self, i: int) -> bool:
        with self.cond:
            self.cond.wait_for(lambda: self.cancelled or self._ready(i))
            if not self.cancelled:
                self.started[i] = True
                self.cond.notify_all()
            return not self.cancelled

    def update(self, **state: Any) -> None:
        with self.cond:
            for k, v in state.items():
                setattr(self, k, v)
            self.cond.notify_all()

    def done(self, i: int) -> None:
        with self.cond:
            self.started[i] = self.finished[i] = True
            self.cond.notify_all()


def run_parallel(specs: list[LaunchSpec], driver: Driver, options: RunOptions) -> None:
    """Run the launches (each wanted, with points left) on their slots at once; returns when all are
    done. The driver's exceptions (a failed point or server without --keep-going) and Ctrl-C stop every
    server, then propagate."""
    if not specs:
        return
    events: queue.Queue[tuple[str, Any]] = queue.Queue()
    turns = _Turns(specs)
    cancel = Cancel()
    to_measure, turns.sequential = interference_state(driver)
    first = 0 if len(specs) > 1 and to_measure else None
    other_measuring = threading.Event()
    if first is not None:
        turns.hold = first

    def emit(event: Any) -> None:
        if isinstance(event, StartedEvent) and first is not None and event.launch.id != specs[first].launch.id:
            other_measuring.set()
        events.put(("event", event))

    def interlude(again: Callable[[], PointOutcome], first_outcome: PointOutcome) -> None:
        alone = [again(), again()]
        turns.update(hold=None)
        wait_s = options.startup_timeout_s + 60.0
        beside = again() if other_measuring.wait(wait_s) else None
        beside_id = next((s.launch.id for i, s in enumerate(specs) if i != first and turns.started[i]), None)
        events.put(("interference", interference_result(
            first_outcome.point.id, [throughput(o) for o in alone], throughput(beside),
            beside_id)))

    def slot_body(slot_launches: list[int]) -> None:
        for i in slot_launches:
            if not turns.wait(i):
                break
            try:
                run_launch_retried(specs[i], emit, cancel=cancel, interlude=interlude if i == first else None)
            except EngineError as exc:
                events.put(("server_failed", (specs[i].launch, exc)))
            except BaseException as exc:  # the driver thread re-raises it
                events.put(("error", exc))
            finally:
                if i == first:
                    turns.update(hold=None)
                turns.done(i)
        events.put(("slot_done", None))

    by_slot: dict[int, list[int]] = {}
    for i, spec in enumerate(specs):
        by_slot.setdefault(spec.placement.slot, []).append(i)
    threads = [threading.Thread(target=slot_body, args=(ids,), name=f"studyc-slot{s}", daemon=True)
               for s, ids in sorted(by_slot.items())]
    for t in threads:
        t.start()
    left = len(threads)
    try:
        while left:
            kind, payload = events.get()
            if kind == "slot_done":
                left -= 1
            elif kind == "event":
                driver.handle(payload)
            elif kind == "server_failed":
                driver.server_failed(*payload)
            elif kind == "interference":
                if not record_interference(driver, payload):
                    turns.update(sequential=True)
            elif kind == "error":
                raise payload
    except BaseException:
        turns.update(cancelled=True)
        cancel.stop_all()
        for t in threads:
            t.join(timeout=60)
        drain(events, driver, lambda item: item[1] if item[0] == "event" else None)
        raise

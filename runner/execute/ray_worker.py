"""The Ray actor side of `studyc run --ray`: runs one launch on the GPUs Ray reserved for it and streams
its events (and the interference measurements) back to the driver; a reaper process stops its servers
if the actor dies.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

from base.errors import EngineError
from runner.execute import reaper
from runner.execute.launch import (
    Cancel,
    LaunchSpec,
    run_launch_retried,
)
from runner.execute.parallel import throughput
from runner.execute.point import PointOutcome
from runner.measure.nvml import gpu_info
from runner.server.placement import Placement


@dataclass(frozen=True)
class End:
    """The last item a launch streams: how run_launch ended."""

    kind: str = "done"  # done | server (EngineError) | cancelled | error
    message: str = ""


@dataclass(frozen=True)
class Node:
    """The first item a launch streams: the Ray node its actor runs on."""

    node_id: str


@dataclass(frozen=True)
class Alone:
    """The interference launch measured its first point twice more alone (output throughputs)."""

    point_id: str
    alone: tuple[float | None, ...]


@dataclass(frozen=True)
class Beside:
    """... and once more beside another launch (None: no launch started beside it in time)."""

    beside: float | None


class LaunchWorker:
    """The actor body: runs one launch at a time on the GPUs Ray gave it, streams its events."""

    def __init__(self) -> None:
        self.cancel = Cancel()
        self.other_measuring = threading.Event()
        self.measure_beside = False
        # Stops the process groups this worker started (vLLM servers run in their own session)
        # if this process dies without stopping them.
        reaper.guard()

    def pid(self) -> int:
        return os.getpid()

    def run(self, spec: LaunchSpec, interference_wait_s: float | None = None) -> Iterator[Any]:
        """Run the launch, streaming its events; with `interference_wait_s`, measure interference after
        its first point (`Alone`, then `Beside` once `beside_started` is called or the wait is over)."""
        import ray  # optional: see runner.execute.ray_exec.require_ray

        spec = localize(spec, _gpu_ids())
        items: queue.Queue[Any] = queue.Queue()
        items.put(Node(ray.get_runtime_context().get_node_id()))

        def interlude(again: Any, first: PointOutcome) -> None:
            items.put(Alone(first.point.id, (throughput(again()), throughput(again()))))
            told = self.other_measuring.wait(interference_wait_s)
            items.put(Beside(throughput(again()) if told and self.measure_beside else None))

        def body() -> None:
            try:
                run_launch_retried(spec, items.put, cancel=self.cancel,
                           interlude=interlude if interference_wait_s is not None else None)
                items.put(End())
            except EngineError as exc:
                items.put(End("server", exc.message))
            except KeyboardInterrupt:
                items.put(End("cancelled", "stopped by the driver"))
            except BaseException as exc:
                items.put(End("error", f"{type(exc).__name__}: {exc}"))

        threading.Thread(target=body, name="studyc-launch", daemon=True).start()
        while True:
            item = items.get()
            yield item
            if isinstance(item, End):
                return

    def beside_started(self, measure: bool = True) -> None:
        """Another launch started measuring on this node (`measure`): the interference point runs
        beside it; or none can (not `measure`): the interference measurement is missing."""
        self.measure_beside = measure
        self.other_measuring.set()

    def stop(self) -> None:
        self.cancel.stop_all()
        self.other_measuring.set()


def _gpu_ids() -> list[str]:
    import ray  # optional: see runner.execute.ray_exec.require_ray

    return [str(g) for g in ray.get_gpu_ids()]


def localize(spec: LaunchSpec, gpu_ids: list[str]) -> LaunchSpec:
    """The spec on the node Ray chose: its servers on the GPU ids Ray reserved (in order), GPU
    telemetry from the first, the load generator unpinned (the driver does not know the node's CPUs).
    A GPU host is one where NVML sees a GPU; on a CPU host the ids are logical, as with --gpus."""
    placed = spec.placement
    shape = [len(ds) for ds in placed.server_devices]
    if len(gpu_ids) >= sum(shape):
        cut, start = [], 0
        for n in shape:
            cut.append(tuple(gpu_ids[start:start + n]))
            start += n
        placed = Placement(placed.launch_id, placed.slot, tuple(cut), None)
    else:
        placed = replace(placed, client_cpus=None)
    first = placed.server_devices[0][0]
    gpu_host = gpu_info(int(first) if first.isdigit() else 0) is not None
    ctx = replace(spec.ctx, client_cpus=None, gpu_index=int(first) if gpu_host and first.isdigit() else 0)
    return replace(spec, placement=placed, ctx=ctx, gpu_host=gpu_host)

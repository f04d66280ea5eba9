"""The load generator's workers: each runs its share of a point (warmup, then closed-loop slots or
open-loop arrivals) on its own event loop, in a process of its own or on the caller's thread.

A worker process is a fresh interpreter running `worker_main`: no fork (the runner may hold threads
and locks) and no re-import of the caller's __main__ (multiprocessing's spawn would). On SIGINT
(Ctrl-C reaches the whole foreground process group) a worker exits at once and silently; the
process that started it raises KeyboardInterrupt as usual and reports.
"""

from __future__ import annotations

import asyncio
import fcntl
import gc
import math
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, NamedTuple

from runner.lifeline import die_with_parent
from runner.load.balance import Balancer
from runner.load.client import Client, Endpoint, Outcome, now
from runner.load.turns import closed_conversations, conversation
from runner.load.workload import Arrival, RequestSpec

__all__ = ["WorkerPlan", "Warmup", "run_inprocess", "run_processes"]

INTERRUPTED_EXIT = 128 + signal.SIGINT
# A worker starts with SIGINT blocked (inherited from the spawning thread) and unblocks it once its
# quiet handler is in place, so Ctrl-C during its imports cannot print a traceback either.
_BOOT = "import sys; from runner.load.workers import worker_main; worker_main(int(sys.argv[1]), int(sys.argv[2]))"


class Warmup(NamedTuple):
    request_index: int
    spec: RequestSpec


@dataclass(frozen=True)
class WorkerPlan:
    """Everything one worker needs; pickled to worker processes."""

    target: Endpoint
    specs: tuple[RequestSpec, ...]  # all measured requests (workers pull indices)
    warmup: tuple[Warmup, ...]  # this worker's warmup requests
    warmup_concurrency: int  # this worker's share of the warmup's requests in flight
    worker_concurrency: int | None  # this worker's share of the concurrency; open loop: its in-flight cap or None
    open_loop: tuple[Arrival, ...] | None  # this worker's arrivals
    request_timeout_s: float
    busy_poll: bool = False
    cpus: tuple[int, ...] | None = None
    replicas: tuple[Endpoint, ...] = ()  # several servers behind the balancer (`target` is the first)
    balance: str = "least_outstanding"
    # Multi-turn: each conversation's (first, end) index range; slots take, and arrivals start, these
    # (the counter and `open_loop` index them). None: every request single, sent as it is taken.
    conversations: tuple[tuple[int, int], ...] | None = None

    @property
    def targets(self) -> tuple[Endpoint, ...]:
        return self.replicas or (self.target,)


class Ran(NamedTuple):
    """What the workers of a point brought back."""

    outcomes: list[Outcome]
    expired: bool  # a worker reached the point's deadline
    stall_s: float | None = None  # the longest event-loop stall of any worker in its measured share


# Messages over a worker process's socket, in order.
@dataclass(frozen=True)
class _Setup:
    plan: WorkerPlan
    counter_path: str
    n: int
    deadline: float
    balance_path: str | None = None  # the balancer state shared by the workers (replicas only)


@dataclass(frozen=True)
class _Warm:
    pass


@dataclass(frozen=True)
class _Go:
    t0: float  # monotonic instant every worker starts its measured share at


@dataclass(frozen=True)
class _Done:
    outcomes: list[Outcome]
    expired: bool
    stall_s: float | None = None


class _Worker:
    """Runs a plan on one event loop: the request loops around a Client."""

    def __init__(self, plan: WorkerPlan, take: Callable[[], int | None], balance_path: str | None = None) -> None:
        self.plan = plan
        self.take = take
        targets = plan.targets
        self.client = Client(targets, plan.request_timeout_s, Balancer(plan.balance, len(targets), balance_path))
        self.spinning = False
        self.watching = False
        self.stall_s: float | None = None  # the longest loop stall seen while measuring

    async def run_warmup(self, deadline: float) -> None:
        if not self.plan.warmup:
            return
        client = self.client
        client.arm(deadline)
        it = iter(self.plan.warmup)

        async def slot() -> None:
            for index, spec in it:
                if client.expired:
                    return
                await client.request(index, spec, True, now())

        await asyncio.gather(*(slot() for _ in range(max(1, self.plan.warmup_concurrency))))

    async def run_measured(self, t0: float, deadline: float) -> None:
        self.client.arm(deadline)
        loop = asyncio.get_running_loop()
        self.spinning = self.watching = True  # set before the task starts: a share with nothing to send ends at once
        spinner = loop.create_task(self._spin() if self.plan.busy_poll else self._watch())
        try:
            if self.plan.open_loop is None:
                await self._closed()
            else:
                await self._open(t0, self.plan.open_loop)
        finally:
            self.spinning = self.watching = False
            await spinner

    async def _spin(self) -> None:
        # A ready callback on every pass makes the loop poll sockets with a zero timeout, so the
        # worker never sleeps in epoll_wait and wakes up ~4x sooner when a chunk lands. The longest
        # gap between passes is the loop's longest stall: no chunk waited longer to be read.
        stall, last = 0.0, now()
        while self.spinning:
            await asyncio.sleep(0)
            t = now()
            stall = max(stall, t - last)
            last = t
        self.stall_s = stall

    async def _watch(self, period_s: float = 0.001) -> None:
        # Without busy polling: a timer every `period_s`; how late it fires is how long the loop was
        # busy elsewhere (uvloop's timers tick in whole ms, so an idle loop reads up to ~1 ms). A stall
        # can start up to a period before the timer is due: the bound kept is the lateness + the period.
        stall = 0.0
        while self.watching:
            due = now() + period_s
            await asyncio.sleep(period_s)
            stall = max(stall, now() - due)
        self.stall_s = stall + period_s

    async def _closed(self) -> None:
        if self.plan.conversations is not None:
            slots = max(1, self.plan.worker_concurrency or 1)
            await closed_conversations(self.client, self.plan.specs, self.plan.conversations, self.take, slots)
            return
        specs = self.plan.specs
        take = self.take
        client = self.client

        async def slot() -> None:
            while not client.expired:
                i = take()
                if i is None:
                    return
                await client.request(i, specs[i], False, now())

        await asyncio.gather(*(slot() for _ in range(max(1, self.plan.worker_concurrency or 1))))

    async def _open(self, t0: float, arrivals: tuple[Arrival, ...]) -> None:
        specs = self.plan.specs
        sem = asyncio.Semaphore(self.plan.worker_concurrency) if self.plan.worker_concurrency else None
        tasks: set[asyncio.Task[Any]] = set()
        loop = asyncio.get_running_loop()
        client = self.client
        units = self.plan.conversations

        def begin(i: int, due: float) -> Coroutine[Any, Any, Any]:
            if units is None:
                return client.request(i, specs[i], False, due)
            return conversation(client, specs, units[i][0], units[i][1], due)

        async def capped(i: int, due: float) -> None:
            try:
                await begin(i, due)
            finally:
                sem.release()  # type: ignore[union-attr]

        for i, offset in arrivals:
            due = t0 + offset
            # uvloop's timers tick in whole milliseconds: sleep to 1 ms short, then yield-spin.
            delay = due - now()
            if delay > 0.0015:
                await asyncio.sleep(delay - 0.001)
            while now() < due and not client.expired:
                await asyncio.sleep(0)
            if client.expired:
                break
            if sem is not None:
                await sem.acquire()
                if client.expired:
                    sem.release()
                    break
                task = loop.create_task(capped(i, due))
            else:
                task = loop.create_task(begin(i, due))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.gather(*tasks)


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop

        return uvloop.new_event_loop()
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        return asyncio.new_event_loop()


class _LocalCounter:
    def __init__(self, n: int) -> None:
        self.n = n
        self.i = 0

    def __call__(self) -> int | None:
        i = self.i
        if i >= self.n:
            return None
        self.i = i + 1
        return i


class _FileCounter:
    """The next measured index, shared by worker processes: 8 bytes in a file under flock(2)."""

    def __init__(self, path: str, n: int) -> None:
        self.fd = os.open(path, os.O_RDWR)
        self.n = n

    def __call__(self) -> int | None:
        fd = self.fd
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            i = int.from_bytes(os.pread(fd, 8, 0), "little")
            if i >= self.n:
                return None
            os.pwrite(fd, (i + 1).to_bytes(8, "little"), 0)
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
        return i


def _exit_quietly(signum: int, frame: Any) -> None:
    # Nothing a worker holds needs cleaning up (the kernel closes its sockets; the parent owns the
    # counter file), and a KeyboardInterrupt raised inside a transport callback would print
    # "Fatal error on transport" from the event loop: leave at once instead.
    os._exit(INTERRUPTED_EXIT)


def worker_main(fd: int, parent: int | None = None) -> None:
    """A worker process: warm up, report, wait for go, measure, send its outcomes back over FD.
    Exits silently when interrupted or when the process that started it has gone (`parent`, its pid: a
    SIGKILLed parent takes the worker with it, `runner.lifeline`)."""
    die_with_parent(parent)
    signal.signal(signal.SIGINT, _exit_quietly)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    gc.disable()
    pipe = Connection(fd)
    try:
        setup: _Setup = pipe.recv()
        plan = setup.plan
        if plan.cpus:
            os.sched_setaffinity(0, plan.cpus)
        loop = _new_loop()
        asyncio.set_event_loop(loop)
        worker = _Worker(plan, _FileCounter(setup.counter_path, setup.n), setup.balance_path)
        try:
            loop.run_until_complete(worker.run_warmup(setup.deadline))
            worker.client.prepare(plan.specs)
            pipe.send(_Warm())
            go = pipe.recv()
            if isinstance(go, _Go):
                loop.run_until_complete(worker.run_measured(go.t0, setup.deadline))
            worker.client.close()
            loop.run_until_complete(asyncio.sleep(0))
            pipe.send(_Done(worker.client.outcomes, worker.client.expired, worker.stall_s))
        finally:
            loop.close()
    except (EOFError, OSError):  # the parent went away (interrupted or killed): nobody to report to
        os._exit(1)
    finally:
        pipe.close()


def run_inprocess(plan: WorkerPlan, n: int, deadline: float) -> Ran:
    """One worker on this process's own thread (no spawn; for tests and debugging)."""
    got: list[Ran] = []

    def body() -> None:
        loop = _new_loop()
        frozen = gc.isenabled()
        gc.disable()
        try:
            worker = _Worker(plan, _LocalCounter(n))
            loop.run_until_complete(worker.run_warmup(deadline))
            worker.client.prepare(plan.specs)
            loop.run_until_complete(worker.run_measured(now(), deadline))
            worker.client.close()
            loop.run_until_complete(asyncio.sleep(0))
            got.append(Ran(worker.client.outcomes, worker.client.expired, worker.stall_s))
        finally:
            loop.close()
            if frozen:
                gc.enable()

    try:
        asyncio.get_running_loop()
        in_loop = True
    except RuntimeError:
        in_loop = False
    if in_loop:  # called from async code: keep its loop free, run ours on a thread
        th = threading.Thread(target=body, name="studyc-loadgen")
        th.start()
        th.join()
    else:
        body()
    return got[0] if got else Ran([], False)


def run_processes(plans: list[WorkerPlan], n: int, deadline: float) -> Ran:
    """One worker process per plan. They warm up, then start their measured shares together."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
    cfd, counter_path = tempfile.mkstemp(prefix="studyc-loadgen-", dir=shm)
    os.write(cfd, bytes(8))
    os.close(cfd)
    balance_path = None
    n_targets = len(plans[0].targets) if plans else 1
    if n_targets > 1:
        bfd, balance_path = tempfile.mkstemp(prefix="studyc-balance-", dir=shm)
        os.close(bfd)
        Balancer.create_shared(n_targets, balance_path)
    pipes: list[Connection] = []
    procs: list[subprocess.Popen] = []
    outcomes: list[Outcome] = []
    stalls: list[float] = []
    timed_out = False
    grace = 30.0
    finished = False
    try:
        for plan in plans:
            mine, theirs = socket.socketpair()
            mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
            try:
                procs.append(subprocess.Popen(
                    [sys.executable, "-c", _BOOT, str(theirs.fileno()), str(os.getpid())],
                    pass_fds=(theirs.fileno(),), env=env, close_fds=True,
                ))
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # a Ctrl-C held back is raised here
            theirs.close()
            pipe = Connection(mine.detach())
            pipes.append(pipe)
            pipe.send(_Setup(plan, counter_path, n, deadline, balance_path))
        live = []
        for pipe in pipes:
            try:
                if _poll(pipe, deadline + grace):
                    pipe.recv()
                    live.append(pipe)
            except (EOFError, OSError):
                pass  # the worker died: its requests are filled in as lost
        t0 = now() + 0.002
        for pipe in live:
            pipe.send(_Go(t0))
        for pipe in live:
            try:
                if _poll(pipe, deadline + grace):
                    done: _Done = pipe.recv()
                    outcomes.extend(done.outcomes)
                    timed_out = timed_out or done.expired
                    if done.stall_s is not None:
                        stalls.append(done.stall_s)
                else:
                    timed_out = True
            except (EOFError, OSError):
                pass
        finished = True
    finally:
        for pipe in pipes:
            pipe.close()
        for p in procs:
            if not finished and p.poll() is None:
                p.terminate()  # interrupted: the workers' results are not wanted
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        os.unlink(counter_path)
        if balance_path is not None:
            os.unlink(balance_path)
    # A worker that died or never reported leaves the stall unknown: it cannot vouch for its reads.
    return Ran(outcomes, timed_out, max(stalls) if stalls and len(stalls) == len(plans) else None)


def _poll(pipe: Connection, until: float) -> bool:
    left = until - now()
    return bool(pipe.poll(None if math.isinf(left) else max(left, 0.0)))


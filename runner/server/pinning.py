"""Where a CPU server's processes run, on a host whose cores the server and the load generator share.

vLLM's CPU engine steps on one thread (it sets torch to one thread for serving) in a process of its
own, `VLLM::EngineCore`, even with VLLM_ENABLE_V1_MULTIPROCESSING=0 (that variable keeps only the
executor in the engine process; the API server stays a process apart). With the `uni` executor
nothing binds that thread to a core, so the kernel may put it on the load generator's core, and the
load generator then reads its tokens in bunches; and its OpenMP pool, sized for every core, keeps a
second thread spinning there. `pin_engine` starts the server on the cores the load generator does
not use, and `pin_front_end` then moves every process but the engine (the API server) beside the
load generator, as vLLM's own CPU binding does (the compute threads on their cores, the front end
on the rest). A launch of several replicas pins each of them so: their engines share the cores the
load generator does not use.

Measured on a 2-core host, the quickstart's 12 points (16 requests of 128 in / 32 out), client on
core 1: server unpinned, up to 40% of the client's token gaps were bunched and TPOT was 1.4 ms at
concurrency 1; engine on core 0 and the API server on core 1, at most 2.5% bunched and 1.1 ms.
"""

from __future__ import annotations

import os
from collections.abc import Collection
from pathlib import Path

from runner.server.procs import group_members

ENGINE_COMM = "VLLM::EngineCor"  # the engine process's name as /proc shows it (15 characters)


def _pin_process(pid: int, cpus: Collection[int]) -> None:
    """Every thread of `pid` (threads it starts later inherit their starter's CPUs)."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            os.sched_setaffinity(int(task.name), set(cpus))
        except (ProcessLookupError, PermissionError):
            pass


def split_server_cpus(client_cpus: Collection[int] | None) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """(engine CPUs, front-end CPUs): the engine on the CPUs this process may use that the load
    generator does not; the API server on the load generator's. None where that leaves the engine
    no CPU, the load generator is not pinned, or the host cannot pin."""
    if not client_cpus or not hasattr(os, "sched_getaffinity"):
        return None
    allowed = sorted(os.sched_getaffinity(0))
    engine = tuple(c for c in allowed if c not in client_cpus)
    front = tuple(c for c in allowed if c in client_cpus)
    return (engine, front) if engine and front else None


def pin_engine(pid: int, client_cpus: Collection[int] | None) -> tuple[int, ...] | None:
    """Right after a CPU server starts, before it has loaded anything: the whole server on the CPUs
    the load generator does not use. The engine process it will start inherits them, and its
    OpenMP pool is sized from them: a pool sized for both cores and pinned to one afterwards
    spin-waits against itself (measured: 9 output tok/s instead of 794 at concurrency 1).
    Returns the engine's CPUs, or None where `split_server_cpus` gives no split (nothing pinned)."""
    split = split_server_cpus(client_cpus)
    if split is None:
        return None
    try:
        _pin_process(pid, split[0])
    except OSError:  # it already exited: its start fails and says why
        return None
    return split[0]


def pin_front_end(pgid: int, client_cpus: Collection[int] | None) -> str:
    """Once the server is ready (its process group `pgid`, started under `pin_engine`): every
    process but the engine (the API server) moves beside the load generator. Returns what was done,
    for the progress line. A group without an engine process (an engine of another kind) stays
    where `pin_engine` put it, and the line says so."""
    split = split_server_cpus(client_cpus)
    if split is None:
        return "server not pinned (no CPU apart from the load generator's)"
    engine_cpus, front_cpus = split
    members = group_members(pgid)
    if not any(comm.startswith(ENGINE_COMM) for _, comm in members):
        return f"server on CPU {_cpus(engine_cpus)} (no {ENGINE_COMM} process found to keep apart)"
    for pid, comm in members:
        if not comm.startswith(ENGINE_COMM):
            try:
                _pin_process(pid, front_cpus)
            except OSError:  # the process ended meanwhile
                pass
    return f"engine on CPU {_cpus(engine_cpus)}, API server beside the load generator on {_cpus(front_cpus)}"


def _cpus(cpus: Collection[int]) -> str:
    return ",".join(str(c) for c in sorted(cpus))

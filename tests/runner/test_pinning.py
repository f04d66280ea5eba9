"""A CPU server's placement: its engine process on the cores the load generator does not use, its
API server beside the load generator. Real processes in a real process group stand in for vLLM's
two (the engine one named as vLLM names it)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from runner.server.pinning import ENGINE_COMM, pin_engine, pin_front_end, split_server_cpus
from runner.server.procs import group_members

CPUS = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
two_cpus = pytest.mark.skipif(len(CPUS) < 2, reason="needs two CPUs to split")

# A group leader (the "API server") that starts a child naming itself as vLLM's engine process,
# and a thread in each, then waits.
SERVER = f"""
import subprocess, sys, threading, time
child = subprocess.Popen([sys.executable, "-c", '''
import threading, time
open("/proc/self/comm", "w").write("{ENGINE_COMM}ore")
threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
print("ready", flush=True)
time.sleep(60)
'''], stdout=sys.stdout)
threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
time.sleep(60)
"""


def _affinities(pid: int) -> set[tuple[int, ...]]:
    return {tuple(sorted(os.sched_getaffinity(int(t.name)))) for t in Path(f"/proc/{pid}/task").iterdir()}


@two_cpus
def test_engine_goes_apart_from_the_load_generator_and_the_api_server_beside_it() -> None:
    client = (CPUS[-1],)
    proc = subprocess.Popen([sys.executable, "-c", SERVER], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        assert pin_engine(proc.pid, client) == tuple(CPUS[:-1])  # at once: the engine is started under it
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        members = dict(group_members(proc.pid))
        engine = [pid for pid, comm in members.items() if comm.startswith(ENGINE_COMM)]
        assert proc.pid in members and len(engine) == 1
        assert _affinities(engine[0]) == {tuple(CPUS[:-1])}  # inherited, every thread
        note = pin_front_end(proc.pid, client)
        assert note == f"engine on CPU {','.join(map(str, CPUS[:-1]))}, API server beside the load generator on {CPUS[-1]}"
        assert _affinities(engine[0]) == {tuple(CPUS[:-1])}
        assert _affinities(proc.pid) == {client}  # every thread of the API server
    finally:
        os.killpg(proc.pid, 9)
        proc.wait()


@two_cpus
def test_a_group_without_an_engine_process_stays_apart_from_the_load_generator() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        pin_engine(proc.pid, (CPUS[-1],))
        time.sleep(0.2)
        assert pin_front_end(proc.pid, (CPUS[-1],)) == \
            f"server on CPU {','.join(map(str, CPUS[:-1]))} (no {ENGINE_COMM} process found to keep apart)"
        assert _affinities(proc.pid) == {tuple(CPUS[:-1])}
    finally:
        proc.kill()
        proc.wait()


def test_no_split_without_a_pinned_load_generator_or_a_core_left_for_the_engine() -> None:
    assert split_server_cpus(None) is None
    assert split_server_cpus(()) is None
    assert split_server_cpus(CPUS) is None  # the load generator has them all
    assert pin_engine(1, None) is None
    assert pin_front_end(1, None) == "server not pinned (no CPU apart from the load generator's)"


@two_cpus
def test_split_is_the_rest_and_the_load_generators_own() -> None:
    assert split_server_cpus((CPUS[-1],)) == (tuple(CPUS[:-1]), (CPUS[-1],))
    assert split_server_cpus((CPUS[-1], 999)) == (tuple(CPUS[:-1]), (CPUS[-1],))  # CPUs not ours are ignored


def test_group_members_reads_names_with_spaces_and_parentheses(tmp_path: Path) -> None:
    for pid, stat in {"10": "10 (vllm) S 1 10 10", "11": "11 (VLLM::EngineCor) S 10 10 10",
                      "12": "12 (a (b) c) S 1 10 10", "13": "13 (other) S 1 13 13", "14": "14 (dead) Z 10 10 10"}.items():
        (tmp_path / pid).mkdir()
        (tmp_path / pid / "stat").write_text(stat)
    (tmp_path / "self").mkdir()
    assert sorted(group_members(10, tmp_path)) == [(10, "vllm"), (11, "VLLM::EngineCor"), (12, "a (b) c")]

"""The reaper a Ray launch worker leaves beside itself: it keeps the groups of the last scan the parent
lived through (a scan its death overlapped finds none), and once the parent is SIGKILLed it stops every
process group under it, one that ignores SIGTERM too, and never its own."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from runner.execute import reaper
from tests.conftest import REPO
from tests.runner.test_run import alive

PARENT = 4242


def run_watch(ppids: list[int], scans: list[set[int]]) -> tuple[set[int], int, list[float]]:
    """watch() against scripted getppid() answers and scan results; returns its groups, how many scans
    it made and its sleeps."""
    answers, sleeps = iter(ppids), []
    found = iter(scans)
    made = 0

    def find() -> set[int]:
        nonlocal made
        made += 1
        return next(found)

    groups = reaper.watch(PARENT, find, lambda: next(answers), sleeps.append, every_s=0.25)
    return groups, made, sleeps


def test_a_scan_the_parents_death_overlapped_is_dropped() -> None:
    # scan 1 with the parent alive finds group 11; the parent dies during scan 2, which finds nothing
    groups, made, sleeps = run_watch([PARENT, PARENT, PARENT, 1], [{11}, set()])
    assert groups == {11} and made == 2 and sleeps == [0.25]


def test_the_latest_whole_scan_wins() -> None:
    groups, made, _ = run_watch([PARENT, PARENT, PARENT, PARENT, 1], [{11}, {12, 13}])
    assert groups == {12, 13} and made == 2


def test_a_parent_already_gone_is_not_scanned() -> None:
    groups, made, sleeps = run_watch([1], [])
    assert groups == set() and made == 0 and sleeps == []


def test_it_scans_every_half_second_by_default() -> None:
    answers, sleeps = iter([PARENT, PARENT, PARENT, 1]), []
    found = iter([{11}, {11}])
    assert reaper.watch(PARENT, lambda: next(found), lambda: next(answers), sleeps.append) == {11}
    assert sleeps == [0.5]


def test_stop_terms_every_group_then_kills_after_the_grace() -> None:
    calls: list[tuple[str, int, int]] = []

    def kill(g: int, sig: int) -> None:
        calls.append(("kill", g, sig))
        if g == 7:
            raise ProcessLookupError  # already gone: the rest are still signalled

    reaper.stop({9, 7, 8}, grace_s=2.5, kill=kill, sleep=lambda s: calls.append(("sleep", 0, s)))
    term, kill_ = signal.SIGTERM, signal.SIGKILL
    assert calls == [("kill", 7, term), ("kill", 8, term), ("kill", 9, term), ("sleep", 0, 2.5),
                     ("kill", 7, kill_), ("kill", 8, kill_), ("kill", 9, kill_), ("sleep", 0, 2.5)]


def test_stop_waits_five_seconds_by_default() -> None:
    sleeps: list[float] = []
    reaper.stop({5}, kill=lambda g, s: None, sleep=sleeps.append)
    assert sleeps == [5.0, 5.0]


def test_nothing_to_stop_ends_at_once() -> None:
    calls: list[object] = []
    reaper.stop(set(), kill=lambda g, s: calls.append(g), sleep=calls.append)
    assert calls == []


def test_guard_leaves_one_reaper_per_process_watching_it(monkeypatch) -> None:
    monkeypatch.setattr(reaper, "_GUARDS", {})
    reaper.guard()
    reaper.guard()
    try:
        assert list(reaper._GUARDS) == [os.getpid()]
        proc = reaper._GUARDS[os.getpid()]
        deadline = time.monotonic() + 10
        argv: list[str] = []
        while len(argv) < 4 and time.monotonic() < deadline:  # its arguments appear just after its exec
            argv = open(f"/proc/{proc.pid}/cmdline").read().split("\0")
            time.sleep(0.01)
        assert argv[1:4] == ["-I", reaper.__file__, str(os.getpid())]
        assert os.getsid(proc.pid) == proc.pid  # a session of its own: it outlives what it watches
    finally:
        proc.kill()
        proc.wait()


def test_main_watches_the_pid_it_is_given_and_stops_what_it_found(monkeypatch) -> None:
    seen: dict[str, object] = {}

    def watch(parent, find, ppid, sleep):
        seen.update(parent=parent, found=find(), ppid=ppid(), sleep=sleep)
        return {31, 32}

    monkeypatch.setattr(reaper, "watch", watch)
    monkeypatch.setattr(reaper, "scan", lambda parent, me: {parent, me})
    monkeypatch.setattr(reaper, "stop", lambda groups: seen.update(stopped=groups))
    reaper.main(["reaper.py", "4242"])
    assert seen == {"parent": 4242, "found": {4242, os.getpid()}, "ppid": os.getppid(),
                    "sleep": time.sleep, "stopped": {31, 32}}


def test_a_parent_gone_after_its_first_scan_leaves_nothing_to_stop() -> None:
    groups, made, sleeps = run_watch([PARENT, 1], [{11}])
    assert groups == set() and made == 1 and sleeps == []


# A parent that starts the reaper beside itself, a server-like group (a leader in its own session and
# its child in the same group) and a group that ignores SIGTERM, prints their pids, then waits.
PARENT_SCRIPT = r"""
import os, signal, subprocess, sys, time
sys.path.insert(0, sys.argv[1])
from runner.execute import reaper as guarded
guarded.guard()
reaper = guarded._GUARDS[os.getpid()]
leader = subprocess.Popen(["sh", "-c", "sleep 300 & wait"], start_new_session=True)
stubborn = subprocess.Popen([sys.executable, "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(1, flush=True); time.sleep(300)"],
    start_new_session=True, stdout=subprocess.PIPE)
stubborn.stdout.readline()  # its SIGTERM handler is set
print(reaper.pid, leader.pid, stubborn.pid, flush=True)
time.sleep(300)
"""


def test_a_killed_parent_leaves_no_group_running_and_the_reaper_spares_itself() -> None:
    parent = subprocess.Popen([sys.executable, "-c", PARENT_SCRIPT, str(REPO)], text=True,
                              stdout=subprocess.PIPE)
    assert parent.stdout is not None
    reaper_pid, leader, stubborn = map(int, parent.stdout.readline().split())
    deadline = time.monotonic() + 10
    while len(grandchildren(leader)) < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    (sleeper,) = grandchildren(leader)
    time.sleep(1.2)  # the reaper has scanned with all of them up
    assert reaper.scan(parent.pid, reaper_pid) == {leader, stubborn}  # the reaper's own group left out
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 15
    while any(alive(p) for p in (leader, sleeper)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(leader) and not alive(sleeper)  # SIGTERM to the group: the leader's child too
    assert alive(stubborn) and alive(reaper_pid)  # it ignores SIGTERM; SIGKILL comes after the grace
    while alive(stubborn) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(stubborn)
    while alive(reaper_pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(reaper_pid)  # the reaper ends once both signals are sent


def grandchildren(pid: int) -> list[int]:
    try:
        text = open(f"/proc/{pid}/task/{pid}/children").read()
    except OSError:
        return []
    return [int(p) for p in text.split()]


def fake_proc(root, stats: dict[int, str]) -> str:
    for pid, text in stats.items():
        (root / str(pid)).mkdir()
        (root / str(pid) / "stat").write_text(text)
    (root / "self").mkdir()
    return str(root)


TREE = {
    100: "100 (ray::LaunchWorker) S 1 50 50",  # the worker, in its Ray group
    101: "101 (python) S 100 50 50",  # a load worker in the worker's group: not a group to stop
    200: "200 (vllm serve) S 100 200 200",  # a server in its own session
    201: "201 (python) S 200 200 200",  # its child, in its group
    202: "202 (compile) S 201 202 202",  # a grandchild that made a session of its own
    210: "210 (a) b) S 100 210 210",  # a name with a parenthesis in it
    203: "203 (x) S 202 777 777",  # in a group whose leader is not under the worker
    400: "400 (reaper) S 100 400 400",  # the reaper itself
    401: "401 (x) S 400 400 400",  # were it to have a child
    900: "900 (other) S 1 900 900",  # not under the worker
}


def test_every_group_under_the_parent_is_found_but_its_own_and_the_reapers(tmp_path) -> None:
    proc = fake_proc(tmp_path, TREE)
    assert reaper.scan(100, 400, proc=proc) == {200, 202, 210, 777}
    assert reaper.scan(202, 400, proc=proc) == {777}
    assert reaper.scan(200, 400, proc=proc) == {202, 777}  # its own group is the caller's to stop
    assert reaper.scan(101, 400, proc=proc) == set()  # no children
    assert reaper.scan(555, 400, proc=proc) == set()  # a parent not found


def test_a_process_that_ends_while_read_is_skipped(tmp_path) -> None:
    """A stat read empty, cut short or garbled (its process ended during the scan) must not end the
    reaper: the rest of the tree is still found."""
    proc = fake_proc(tmp_path, TREE | {
        300: "",  # ended between the listing and the read
        301: "301 (sh) S 100",  # cut short
        302: "302 (a) b) S x 302",  # garbled numbers
    })
    assert reaper.scan(100, 400, proc=proc) == {200, 202, 210, 777}

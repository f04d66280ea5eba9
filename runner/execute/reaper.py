"""The reaper `studyc run` and each Ray launch worker leave beside themselves (`guard`):
`python reaper.py PARENT_PID` watches the process groups under PARENT (vLLM servers and calibration
probes run in sessions of their own) and, once PARENT is gone, stops those still there with SIGTERM,
then SIGKILL. A process that stops its servers before it exits leaves nothing to stop; one killed
outright (SIGKILL, the OOM killer, a CI job's timeout) leaves no server holding the GPU. Standard
library only: it runs as a plain script, in its own session, so that it outlives what it watches.
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable


def scan(parent: int, me: int, proc: str = "/proc") -> set[int]:
    """The process groups of `parent`'s descendants (`me` and its children left out), less `parent`'s
    own group: a vLLM server's session and any group a process under it made, led by a descendant or
    not. None where `parent` is not found. A process that ends while it is read (its stat unreadable,
    empty or cut short) is skipped."""
    kids: dict[int, list[int]] = {}
    group: dict[int, int] = {}
    for d in os.listdir(proc):
        if not d.isdigit():
            continue
        try:
            with open(f"{proc}/{d}/stat") as f:
                stat = f.read()
            up, pgrp = stat[stat.rfind(")") + 2:].split()[1:3]
            group[int(d)] = int(pgrp)
            kids.setdefault(int(up), []).append(int(d))
        except (OSError, ValueError):
            continue
    if parent not in group:
        return set()
    found, frontier = set(), [parent]
    while frontier:
        for pid in kids.get(frontier.pop(), []):
            if pid != me:
                frontier.append(pid)
                found.add(group[pid])
    return found - {group[parent]}


def watch(parent: int, find: Callable[[], set[int]], ppid: Callable[[], int],
          sleep: Callable[[float], None], every_s: float = 0.5) -> set[int]:
    """Scan while `parent` is this process's parent; return the groups of the last scan that began and
    ended with the parent alive. A scan the parent's death overlapped is dropped: its children are
    already re-parented, so it finds none of them."""
    groups: set[int] = set()
    while ppid() == parent:
        found = find()
        if ppid() != parent:
            break
        groups = found
        sleep(every_s)
    return groups


def stop(groups: set[int], grace_s: float = 5.0, kill: Callable[[int, int], None] = os.killpg,
         sleep: Callable[[float], None] = time.sleep) -> None:
    """SIGTERM every group, then SIGKILL those left after `grace_s`; a group already gone is skipped."""
    if not groups:
        return
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for g in sorted(groups):
            try:
                kill(g, sig)
            except OSError:
                pass
        sleep(grace_s)


_GUARDS: dict[int, subprocess.Popen[bytes]] = {}


def guard() -> None:
    """Leave a reaper beside this process, once per process."""
    me = os.getpid()
    if me not in _GUARDS:
        _GUARDS[me] = subprocess.Popen([sys.executable, "-I", __file__, str(me)], stdin=subprocess.DEVNULL,
                                       start_new_session=True)


def main(argv: list[str]) -> None:
    parent, me = int(argv[1]), os.getpid()
    stop(watch(parent, functools.partial(scan, parent, me), os.getppid, time.sleep))


if __name__ == "__main__":
    main(sys.argv)

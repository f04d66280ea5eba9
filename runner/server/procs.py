"""The live processes of a process group, read from /proc (Linux)."""

from __future__ import annotations

from pathlib import Path


def group_members(pgid: int, proc: Path = Path("/proc")) -> list[tuple[int, str]]:
    """(pid, name) of every live process in process group `pgid`."""
    found = []
    for d in proc.iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        # "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses.
        comm = stat[stat.find("(") + 1:stat.rfind(")")]
        rest = stat[stat.rfind(")") + 2:].split()
        if len(rest) >= 3 and rest[0] != "Z" and int(rest[2]) == pgid:
            found.append((int(d.name), comm))
    return found

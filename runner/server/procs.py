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


def _stat_fields(pid: int, proc: Path) -> list[str] | None:
    """The fields of /proc/PID/stat after `comm` (state first), or None when the process is gone."""
    try:
        stat = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    return stat[stat.rfind(")") + 2:].split()


def group_cpu_ticks(pgid: int, proc: Path = Path("/proc")) -> dict[int, int]:
    """pid -> CPU time used so far (user + system, in clock ticks) of each live member of group `pgid`."""
    out = {}
    for pid, _ in group_members(pgid, proc):
        fields = _stat_fields(pid, proc)
        if fields is not None and len(fields) > 12:
            out[pid] = int(fields[11]) + int(fields[12])  # utime, stime: fields 14 and 15 of stat
    return out


def group_stopped(pgid: int, proc: Path = Path("/proc")) -> bool:
    """Whether every live member of group `pgid` is stopped by a signal (state T), and it has one."""
    states = [(_stat_fields(pid, proc) or ["?"])[0] for pid, _ in group_members(pgid, proc)]
    return bool(states) and all(s == "T" for s in states)

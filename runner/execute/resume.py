"""`--resume` by whole blocks: a block's arms are compared with each other, so they run on one host. A
block with points still to run whose measured points ran on another host (or on one not recorded) is run
again whole here; its earlier points are kept in the database, set aside (`Store.set_aside`).

A capacity search is measured on one start: one cut short (its next probe not stored) is run again whole
on the resumed start, its probes so far set aside; a search that ended is kept as it is.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from compiler.capacity import replay, stored_held, stored_level
from compiler.plan import Plan
from runner.store.store import Store


@dataclass(frozen=True)
class BlockRerun:
    block: int
    hosts: tuple[str, ...]  # where its measured points ran ("not recorded" for servers stored without one)
    point_ids: tuple[str, ...]  # the points set aside


def split_blocks(store: Store, run_id: str, plan: Plan, done: Mapping[str, str], here: str) -> list[BlockRerun]:
    """The blocks that would run on two hosts if resumed on `here`: some of their points are still to run,
    and some measured ones ran elsewhere. A block measured whole stays as it is, wherever it ran."""
    host_of: dict[str, str] = {}
    for s in store.servers(run_id):
        host = s.machine_id or "not recorded"
        host_of[s.server_id] = host
        host_of.setdefault(s.launch_id or s.server_id, host)  # replicas' points name the launch
    server_of = {p.point_id: p.server_id or "" for p in store.points(run_id)}
    out = []
    for block in sorted({launch.block for launch in plan.launches}):
        steps = [p for launch in plan.launches if launch.block == block for p in launch.points]
        measured = [p.id for p in steps if done.get(p.id) == p.fingerprint]
        if not measured or len(measured) == len(steps):
            continue
        hosts = tuple(sorted({host_of.get(server_of.get(pid, ""), "not recorded") for pid in measured}))
        if hosts != (here,):
            out.append(BlockRerun(block, hosts, tuple(sorted(p.id for p in steps if p.id in done))))
    return out


def rerun_whole_blocks(store: Store, run_id: str, plan: Plan, done: dict[str, str], here: str) -> tuple[
        dict[str, str], list[str]]:
    """(the points `--resume` may skip, a message per block run again): each block `split_blocks` finds is
    set aside and run again whole on `here`."""
    messages = []
    for rerun in split_blocks(store, run_id, plan, done, here):
        reason = (f"block {rerun.block} run again whole on {here} by --resume: these ran on "
                  f"{', '.join(rerun.hosts)}")
        store.set_aside(run_id, rerun.point_ids, reason)
        for pid in rerun.point_ids:
            done.pop(pid, None)
        messages.append(f"{reason} ({len(rerun.point_ids)} points kept, set aside)")
    return done, messages


def rerun_cut_searches(store: Store, run_id: str, plan: Plan, done: dict[str, str]) -> tuple[
        dict[str, str], list[str]]:
    """(the points `--resume` may skip, a message per search run again): every search whose stored probes
    stop short of its end (`compiler.capacity.replay`: still running) is set aside and run again whole."""
    stored = {p.point_id: p for p in store.points(run_id) if p.point_id in done}
    messages = []
    for search in (q for launch in plan.launches for q in launch.searches):
        probes = [p for pid, p in stored.items() if pid.startswith(search.id + "/")]
        if not probes:
            continue
        levels = {level: stored_held(search, p) for p in probes if (level := stored_level(search, p)) is not None}
        _, now = replay(search, levels)
        if now.status != "running":
            continue
        ids = sorted(p.point_id for p in probes)
        reason = f"capacity search {search.id} cut short after {now.probes} probe(s): run again whole by --resume"
        store.set_aside(run_id, ids, reason)
        for pid in ids:
            done.pop(pid, None)
        messages.append(f"{reason} ({len(ids)} probe(s) kept, set aside)")
    return done, messages

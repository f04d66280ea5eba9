"""When launches on a Ray cluster may be dispatched, and when the interference launch measures beside
another (`runner.execute.ray_exec`). Pure bookkeeping, so every branch is tested without a cluster.

The rule is `runner.execute.parallel`'s: the first launch runs alone until its first point has been measured
twice more (`alone`); then the others are dispatched in block turns, and the first measures once more
beside the first launch that starts measuring on its node. Once every other dispatched launch has
started on another node (or ended), nothing can start beside it: it gives up, the measurement is
missing, and the gate closes. A closed gate dispatches one launch at a time, in plan order, each once
every launch before it has finished.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass
class Gate:
    """`order` is the wanted launches in plan order, `blocks` their blocks; `first` measures, or None
    where no two launches can run at once (one launch, or a cluster too small for two)."""

    order: Sequence[int]
    blocks: dict[int, int]
    first: int | None
    hold: bool = field(init=False)  # only the first may be dispatched (it is measuring alone)
    alone_done: bool = False
    beside: int | None = None  # the launch it was told to measure beside
    gave_up: bool = False  # told that no launch can start beside it
    sequential: bool = False  # closed: one launch at a time from here on
    started: set[int] = field(default_factory=set)
    finished: set[int] = field(default_factory=set)
    dispatched: set[int] = field(default_factory=set)
    nodes: dict[int, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.hold = self.first is not None

    def ready(self, i: int) -> bool:
        if i in self.dispatched:
            return False
        if self.hold:
            return i == self.first
        if self.sequential:
            return all(j in self.finished for j in self.order if j < i)
        return all(j in self.started for j in self.order if self.blocks[j] < self.blocks[i])

    def to_dispatch(self) -> list[int]:
        """The launches to dispatch now (marked dispatched)."""
        now = [i for i in self.order if self.ready(i)]
        self.dispatched.update(now)
        return now

    def measured_alone(self) -> None:
        self.alone_done, self.hold = True, False

    def on_started(self, i: int, node: str | None) -> int | None:
        """Launch i started measuring on `node`: returns i when the first is to measure beside it."""
        self.started.add(i)
        if node is not None:
            self.nodes[i] = node
        first_node = self.nodes.get(self.first) if self.first is not None else None
        if (not self.alone_done or i == self.first or self.beside is not None or self.gave_up
                or self.first in self.finished or first_node is None or node != first_node):
            return None
        self.beside = i
        return i

    def on_ended(self, i: int, again: bool = False) -> None:
        """Launch i ended (`again`: its rest is dispatched once more, so it has not finished)."""
        self.started.add(i)
        if not again:
            self.finished.add(i)
        if i == self.first:
            self.hold = False

    def give_up(self) -> bool:
        """True (once) when the first waits for a launch beside it and none can come: every other
        dispatched launch has started or ended, and no undispatched one is left."""
        if (self.first is None or not self.alone_done or self.beside is not None or self.gave_up
                or self.first in self.finished):
            return False
        others = [i for i in self.order if i != self.first]
        if any(i not in self.dispatched or i not in self.started for i in others):
            return False
        self.gave_up = True
        return True

    def measured(self, parallel: bool) -> None:
        """The interference record is in: launches keep running side by side, or the gate closes."""
        self.sequential = self.sequential or not parallel

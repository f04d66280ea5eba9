"""Replicas: the balancer that picks one server per request, the way a production load balancer would:
least outstanding requests (the target with the fewest requests in flight, ties to the lowest index;
the default) or round robin (in turn). Worker processes of one point share its state through a small
file under flock(2), so "outstanding" counts every worker's requests.
"""

from __future__ import annotations

import fcntl
import os
from typing import Any

__all__ = ["BALANCE_POLICIES", "Balancer"]

BALANCE_POLICIES = ("least_outstanding", "round_robin")


class Balancer:
    """Picks a target per request: `least_outstanding` (fewest in flight, ties to the lowest index) or
    `round_robin`. State is local, or shared by worker processes through a file (`path`): n+1 int64
    slots (in-flight count per target, then the round-robin sequence) read and written under flock."""

    def __init__(self, policy: str, n: int, path: str | None = None) -> None:
        if policy not in BALANCE_POLICIES:
            raise ValueError(f"balance must be one of {', '.join(BALANCE_POLICIES)}, got {policy!r}")
        if n < 1:
            raise ValueError("a balancer needs at least one target")
        self.policy = policy
        self.n = n
        self.path = path
        self._fd = os.open(path, os.O_RDWR) if path is not None else None
        self._state = [0] * (n + 1)

    @staticmethod
    def create_shared(n: int, path: str) -> None:
        """Write the zeroed state file that worker processes open with `Balancer(policy, n, path)`."""
        with open(path, "wb") as fh:
            fh.write(bytes(8 * (n + 1)))

    def _update(self, fn: Any) -> int:
        fd = self._fd
        if fd is None:
            return int(fn(self._state))
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            raw = os.pread(fd, 8 * (self.n + 1), 0)
            state = [int.from_bytes(raw[8 * i: 8 * i + 8], "little", signed=True) for i in range(self.n + 1)]
            out = fn(state)
            os.pwrite(fd, b"".join(v.to_bytes(8, "little", signed=True) for v in state), 0)
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
        return int(out)

    def pick(self) -> int:
        """The target of the next request; counts it as outstanding until `release`."""
        return self._update(self._pick)

    def _pick(self, state: list[int]) -> int:
        n = self.n
        if self.policy == "round_robin":
            i = state[n] % n
            state[n] += 1
        else:
            i = min(range(n), key=lambda k: (state[k], k))
        state[i] += 1
        return i

    def hold(self, i: int) -> int:
        """Count a request to target `i` as outstanding (a conversation's later turn: sticky routing)."""
        def inc(state: list[int]) -> int:
            state[i] += 1
            return i

        return self._update(inc)

    def release(self, i: int) -> None:
        def dec(state: list[int]) -> int:
            state[i] -= 1
            return 0

        if self.n > 1:
            self._update(dec)

    def outstanding(self) -> list[int]:
        got: list[int] = []

        def read(state: list[int]) -> int:
            got.extend(state[: self.n])
            return 0

        self._update(read)
        return got

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

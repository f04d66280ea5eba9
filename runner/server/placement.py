"""Which devices a launch gets, and which client CPUs its load generator uses.

Devices are GPU indices on a GPU host (a server gets CUDA_VISIBLE_DEVICES for its own) or logical
ids on a CPU host, where they are only slots: CPU servers share the host's cores. The devices are cut
into slots of `slot_size` devices (the largest launch); launches on different slots may run at the
same time. Assignment rotates with the blocks: the launch of the arm at study index a in block b
goes to slot `(a + b - 1) mod n_slots`, so over the blocks every arm visits every slot and a
device's identity never lines up with an arm. (Rotating by run order instead would cancel out: two
arms alternate AB, BA, ... so the same arm would always land on the same slot.)

Pure but for `idle_gpus`, which asks NVML.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from base.errors import StudycError
from compiler.plan import Launch, Plan

IDLE_MEMORY_BYTES = 1 << 30  # a GPU with more memory in use than this is taken to be busy


@dataclass(frozen=True)
class Placement:
    """Where one launch runs: its slot, the devices of each of its servers, its client CPUs."""

    launch_id: str
    slot: int
    server_devices: tuple[tuple[str, ...], ...]  # one tuple of device ids per replica
    client_cpus: tuple[int, ...] | None

    @property
    def devices(self) -> tuple[str, ...]:
        return tuple(d for ds in self.server_devices for d in ds)


def parse_gpus(spec: str) -> tuple[str, ...]:
    """`--gpus 0,1` or `0-3` -> device ids, in order, without repeats; StudycError on anything else."""
    out: list[str] = []
    for part in spec.split(","):
        part = part.strip()
        lo, dash, hi = part.partition("-")
        try:
            ids = range(int(lo), int(hi) + 1) if dash else [int(lo)]
        except ValueError:
            raise StudycError(f"--gpus: cannot read {spec!r} (use device ids like 0,1 or 0-3)") from None
        for i in ids:
            if i < 0:
                raise StudycError(f"--gpus: device ids are >= 0, got {spec!r}")
            if str(i) not in out:
                out.append(str(i))
    if not out:
        raise StudycError("--gpus: no device named")
    return tuple(out)


def idle_gpus() -> tuple[str, ...] | None:
    """Indices of the visible GPUs NVML shows idle (no compute process, under 1 GiB in use); None
    where NVML finds no GPU (a CPU host)."""
    try:
        import pynvml as nv
    except ImportError:
        return None
    try:
        nv.nvmlInit()
    except Exception:
        return None
    try:
        count = nv.nvmlDeviceGetCount()
        if count == 0:
            return None
        found = []
        for i in range(count):
            h = nv.nvmlDeviceGetHandleByIndex(i)
            try:
                procs = nv.nvmlDeviceGetComputeRunningProcesses(h)
            except Exception:
                procs = []
            used = nv.nvmlDeviceGetMemoryInfo(h).used
            if not procs and used < IDLE_MEMORY_BYTES:
                found.append(str(i))
        return tuple(found)
    finally:
        try:
            nv.nvmlShutdown()
        except Exception:
            pass


def slots(devices: Sequence[str], slot_size: int) -> list[tuple[str, ...]]:
    """Consecutive groups of `slot_size` devices (leftovers unused)."""
    size = max(1, slot_size)
    return [tuple(devices[i:i + size]) for i in range(0, len(devices) - size + 1, size)]


def rotated_slot(arm_index: int, block: int, n_slots: int) -> int:
    """The slot of the arm at study index `arm_index` (0-based) in block `block` (1-based)."""
    return (arm_index + block - 1) % max(1, n_slots)


def split_cpus(cpus: tuple[int, ...] | None, n: int) -> list[tuple[int, ...] | None]:
    """The client CPUs shared out between `n` concurrent launches: contiguous, as even as possible;
    with fewer CPUs than launches, launch k gets CPU k mod len(cpus) (shared). None stays None."""
    if cpus is None or n <= 1:
        return [cpus] * max(1, n)
    if len(cpus) < n:
        return [(cpus[k % len(cpus)],) for k in range(n)]
    base, extra = divmod(len(cpus), n)
    out: list[tuple[int, ...] | None] = []
    start = 0
    for k in range(n):
        size = base + (1 if k < extra else 0)
        out.append(tuple(cpus[start:start + size]))
        start += size
    return out


def place(plan: Plan, devices: Sequence[str], *, gpu_host: bool,
          client_cpus: tuple[int, ...] | None = None) -> list[Placement]:
    """A placement for every launch of the plan, in plan order.

    On a GPU host a launch needs `launch.gpus` devices; a plan whose largest launch does not fit the
    devices is refused. On a CPU host a launch that needs more logical devices than exist shares the
    slot's (recorded as repeated ids)."""
    if not devices:
        raise StudycError("no device to run on: name them with --gpus (e.g. --gpus 0,1)")
    largest = max((launch.gpus for launch in plan.launches), default=1)
    if gpu_host and largest > len(devices):
        raise StudycError(
            f"{plan.study_id}: a launch needs {largest} GPUs and {len(devices)} are available "
            f"({','.join(devices)}): pass more with --gpus"
        )
    groups = slots(devices, min(largest, len(devices)))
    arms = list(dict.fromkeys(launch.arm for launch in plan.launches))
    cpu_shares = split_cpus(client_cpus, len(groups))
    out = []
    for launch in plan.launches:
        s = rotated_slot(arms.index(launch.arm), launch.block, len(groups))
        out.append(Placement(launch.id, s, _server_devices(launch, groups[s]), cpu_shares[s]))
    return out


def _server_devices(launch: Launch, group: tuple[str, ...]) -> tuple[tuple[str, ...], ...]:
    per = max(1, launch.gpus_per_server)
    need = per * max(1, launch.replicas)
    ids = [group[k % len(group)] for k in range(need)]
    return tuple(tuple(ids[r * per:(r + 1) * per]) for r in range(max(1, launch.replicas)))

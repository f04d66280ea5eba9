"""What the block planner's spreads are read from (report.planning.block_planner takes these and reads no
database): each valid, exchangeable repeat that earlier runs stored of a point on the same GPU, model and
vLLM version, as its positive metric values with the configuration, run, launch and block it was measured on."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from compiler.plan import Launch, Plan, PointStep
from report.results import run_order, same_gpu
from report.stats.intervals import layout
from runner.store.store import Store

Key = tuple[Any, ...]


def launch_configuration(launch: Launch) -> tuple[str, ...]:
    """What makes two launches the same server: its engine configuration (the argv, see
    `compiler.plan.Engine`) and the environment the study gives it (an arm's `env`: the same argv with
    VLLM_WORKER_MULTIPROC_METHOD=fork is another server, which starts and serves differently)."""
    return (*launch.engine.configuration, *(f"env {name}={value}" for name, value in sorted(launch.env.items())))


def config_key(launch: Launch, point: PointStep) -> Key:
    """What makes two measurements the same configuration: the launch's (`launch_configuration`), the
    workload's shape, the cache policy and the load level."""
    return (launch_configuration(launch), point.input_len, point.output_len, point.prefix_len, point.cache,
            point.concurrency, point.rate_rps, point.shape_key)


def model_name(launch: Launch) -> str:
    """The launch's model folder's name."""
    return Path(launch.model_dir).name


@dataclass(frozen=True, slots=True)
class Measured:
    """One positive value of one metric at one repeat of a stored run's point."""

    metric: str
    config: Key  # `config_key` of the point
    run_id: str
    launch: str  # the launch it ran on
    block: int | None  # that launch's block; None where the run's design has none
    value: float


@dataclass(frozen=True)
class StoredRepeats:
    """The values the earlier runs measured, in the order stored (runs oldest first), and their vLLM version."""

    measured: tuple[Measured, ...]
    vllm_version: str | None


def read_repeats(db: Path, hardware: str, models: Sequence[str], vllm_version: str | None = None) -> StoredRepeats:
    """The exchangeable repeats of valid points stored in `db` by runs on `hardware` serving one of `models`
    (folder names), of one vLLM version: the given one, else the newest such run's."""
    found: list[Measured] = []
    with Store(db, read_only=True) as store:
        runs = sorted((r for r in store.runs() if same_gpu(r.gpu_name, hardware)), key=run_order)
        version = vllm_version or (runs[-1].vllm_version if runs else None)
        for run in (r for r in runs if r.vllm_version == version):
            plan = Plan.from_stored(run.plan_json)
            if plan is None:
                continue
            steps = {p.id: (launch, p) for launch in plan.launches for p in launch.points
                     if model_name(launch) in models}
            places = layout(plan)
            for point in store.points(run.run_id):
                if point.status != "ok" or not point.valid or point.point_id not in steps:
                    continue
                place = places.point(point.point_id, point.server_id, point.repeat)
                if not place.exchangeable:
                    continue
                config = config_key(*steps[point.point_id])
                for name, value in vars(point.summary).items():
                    if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
                        found.append(Measured(name, config, run.run_id, place.launch, place.block, value))
    return StoredRepeats(tuple(found), version)

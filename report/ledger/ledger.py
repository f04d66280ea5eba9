"""The step-time model's ledger, reading side: every measured point of the stored runs with what replays
it (engine, model shape, load), and the model's predictions for a plan's points.

Reads the results database through `runner.store.store` only; the fit and its leave-one-study-out validation are
`report.ledger.ledger_fit`'s, the command-line tables `report.ledger.ledger_text`'s.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from compiler.hardware import hardware_key
from compiler.modelconfig import load_model
from compiler.modelmath import ModelShape
from compiler.plan import Launch, Plan, PointStep, kept_prompts
from compiler.stepcost import Card, EngineShape
from compiler.stepfit import ModelKey
from compiler.stepreplay import StepLoad, StepPrediction, cache_hit_tokens, predict
from compiler.target_card import Calibration, PricedCard, target_card
from compiler.workload_check import conversation_requests
from report.ledger.ledger_fit import ANY_GPU, METRICS, StoredPoint, fit_keys
from report.ledger.saturation import saturation

if TYPE_CHECKING:
    from runner.store.records import PointSummary, RunRecord
    from runner.store.store import Store

REPO = Path(__file__).resolve().parents[2]
# Checks about the steady phase inside the window. The model replays the whole measured window (warm-up
# sends excluded, ramp and drain included), so a point that fails only these still measures what it
# predicts; a point with any other failed fail-level check (errors, output, reconciliation) is left out.
# Warn-level failures (a kept cache, by design) and unverified checks do not leave a point out: the
# replay models the cache, and the client-side numbers are exact either way.
WINDOW_CHECKS = frozenset({"steady_state", "warmup_sufficient", "littles_law"})


# ---- reading ----------------------------------------------------------------------------------
def _gpu_label(name: str | None) -> str:
    return (name or "unknown").removeprefix("NVIDIA ").strip()


def _model_dir(model_dir: str, root: Path) -> Path:
    """A plan's model folder: relative to `root`; an absolute one that is not here (a plan compiled in
    another checkout) is found by its part from `models/` on, under `root`."""
    p = Path(model_dir)
    if not p.is_absolute():
        return root / p
    if not p.exists() and "models" in p.parts:
        local = root.joinpath(*p.parts[len(p.parts) - 1 - p.parts[::-1].index("models"):])
        if local.exists():
            return local
    return p


def engine_shape(launch: Launch) -> EngineShape:
    """The scheduler settings of a launch (its typed engine settings), vLLM's defaults where it sets none."""
    e = launch.engine
    given = {"budget_tokens": e.max_num_batched_tokens, "max_num_seqs": e.max_num_seqs}
    return EngineShape(**{k: v for k, v in given.items() if v is not None},
                       dtype="bf16" if e.dtype in (None, "auto") else str(e.dtype),
                       kv_cache_dtype=launch.kv_cache_dtype, enforce_eager=e.enforce_eager,
                       prefix_caching=e.prefix_caching, chunked_prefill=e.chunked_prefill,
                       async_scheduling=e.async_scheduling)


def cached_tokens(points: Sequence[PointStep]) -> dict[str, tuple[int, ...]]:
    """Prefix-cache hits per request of each point of one launch, in plan order: a kept cache holds every
    prompt an earlier point sent (the kept-cache rule, `compiler.plan.kept_prompts`); a reset one holds
    none. A shared prefix is held once any request has sent it, since the cache was last reset."""
    warm = kept_prompts(points)
    prefix_warm = False
    out: dict[str, tuple[int, ...]] = {}
    for p in points:
        if p.cache != "keep":
            prefix_warm = False
        hits = []
        for i in range(p.requests):
            shared = cache_hit_tokens(p.prefix_len + 1) if p.prefix_len and prefix_warm else 0
            hits.append(cache_hit_tokens(p.input_len) if i < warm[p.id] else shared)
            prefix_warm = True
        out[p.id] = tuple(hits)
    return out


def unreplayed(point: PointStep) -> str | None:
    """Why the replay cannot predict `point`, or None: it replays closed loops of fixed-length requests with
    at most one shared prefix, single or in conversations on a cache reset before the point
    (`compiler.stepreplay.StepLoad`; validation refuses a conversation that does not fit max_model_len, so
    none is clipped)."""
    if point.concurrency is None:
        return "an open-loop (request rate) point: the replay runs closed loops only"
    shape = point.shape
    if shape is None:
        return None
    what = ["a replayed trace"] if shape.trace is not None else []
    fixed = isinstance(shape.input, int) and isinstance(shape.output, int)
    what += ["drawn lengths"] if shape.trace is None and not fixed else []
    what += [f"{shape.templates} shared prefixes"] if shape.templates > 1 else []
    if shape.turns > 1 and point.cache == "keep":
        what += [f"{shape.turns}-turn conversations on a kept cache"]
    if not what:
        return None
    return (f"its workload ({', '.join(what)}) is not replayed: the replay sends fixed-length requests, "
            "single or in conversations")


def conversation_load(point: PointStep) -> StepLoad:
    """A conversation point's load: turn k's prompt is turn k-1's prompt, its reply (synthetic tokens, so
    never a cache hit) and a new user message; with prefix caching it hits turn k-1's prompt, and the
    first turn the shared prefix once any conversation has sent it (the cache is reset before the point)."""
    shape = point.shape
    assert shape is not None and point.concurrency is not None
    assert isinstance(shape.input, int) and isinstance(shape.output, int)
    turns, user, reply = shape.turns, shape.input, shape.output
    requests = conversation_requests(point.requests, turns)
    shared = cache_hit_tokens(point.prefix_len + 1) if point.prefix_len else 0
    lens: list[int] = []
    hits: list[int] = []
    for c in range(requests // turns):
        prompt = 0
        for k in range(turns):
            previous, prompt = prompt, (prompt + reply + user if k else user)
            lens.append(prompt)
            hits.append(cache_hit_tokens(previous + 1) if k else (shared if c else 0))
    return StepLoad(point.concurrency, requests, user, reply, tuple(hits), tuple(lens), turns, shape.think_s)


def plan_loads(plan: Plan, root: Path = REPO) -> dict[str, tuple[EngineShape, ModelShape, StepLoad]]:
    """Every point of a plan the replay can predict (`unreplayed` says which not): its engine, model shape
    and load."""
    out: dict[str, tuple[EngineShape, ModelShape, StepLoad]] = {}
    shapes: dict[str, ModelShape] = {}
    for launch in plan.launches:
        engine = engine_shape(launch)
        if launch.model_dir not in shapes:
            shapes[launch.model_dir] = load_model(_model_dir(launch.model_dir, root))
        cached = cached_tokens(launch.points)
        for p in launch.points:
            if p.concurrency is None or unreplayed(p) is not None:
                continue
            if p.shape is not None:  # a conversation (the one shape replayed)
                load = conversation_load(p)
            else:
                load = StepLoad(p.concurrency, p.requests, p.input_len, p.output_len, cached[p.id])
            out[p.id] = (engine, shapes[launch.model_dir], load)
    return out


def read_points(db: str | Path, root: Path = REPO) -> list[StoredPoint]:
    """Every valid, complete point of the latest calibrated run of each study in `db`, with what replays it."""
    return read_ledger(db, root)[0]


def read_ledger(db: str | Path, root: Path = REPO) -> tuple[list[StoredPoint], list[dict[str, Any]]]:
    """`read_points` and `unreplayed_points` of `db` from one opening of it (each plan read once)."""
    from runner.store.store import Store

    with Store(db, read_only=True) as store:
        plans = _latest_plans(store)
        return store_points(store, root, plans), _unreplayed(store, plans)


def store_points(store: Store, root: Path = REPO,
                 plans: list[tuple[RunRecord, Plan]] | None = None) -> list[StoredPoint]:
    """`read_points` from an open store (the runner's, while it writes the same file); `plans`: its
    `_latest_plans`, where the caller has them."""
    out: list[StoredPoint] = []
    for run, plan in _latest_plans(store) if plans is None else plans:
        assert run.bandwidth_Bps is not None and run.flops_bf16 is not None
        loads = plan_loads(plan, root)
        card = Card(float(run.bandwidth_Bps), float(run.flops_bf16))
        sends = store.send_times(run.run_id)
        requests = store.run_request_records(run.run_id)
        failed: dict[str, set[str]] = defaultdict(set)
        for check in store.checks(run.run_id):
            if check.status == "fail" and check.severity == "fail":
                failed[check.point_id].add(check.name)
        kv_capacity = {s.server_id: s.kv_capacity_tokens for s in store.servers(run.run_id)}
        for point in store.points(run.run_id):
            if point.status != "ok" or failed[point.point_id] - WINDOW_CHECKS or point.point_id not in loads:
                continue
            engine, shape, load = loads[point.point_id]
            key = key_of(_gpu_label(run.gpu_name), str(run.vllm_version), shape, engine)
            s = whole_window(requests.get(point.point_id, []), load.concurrency)
            measured = {"output_throughput": s.output_throughput, "tpot_s": s.tpot_mean_s,
                        "ttft_s": s.ttft_mean_s, "window_s": s.window_s,
                        "burst_s": _burst(sends.get(point.point_id, []), min(load.concurrency, load.requests))}
            out.append(StoredPoint(run.study_id, run.run_id, point.point_id, point.arm, point.workload,
                                   load.concurrency, key, shape.name, shape, load, engine, card, measured,
                                   saturation(load, engine, point.summary.preemptions,
                                              kv_capacity.get(point.server_id or ""))))
    return out


def _latest_plans(store: Store) -> list[tuple[RunRecord, Plan]]:
    """The latest calibrated run of each study on each GPU in the store, with its plan (a study's latest run
    on a GPU replaces its earlier ones there; a run whose plan is not readable is left out)."""
    runs = [run for run in store.runs()
            if run.calibrated and run.plan_json and (run.bandwidth_Bps or 0) > 0 and (run.flops_bf16 or 0) > 0]
    latest = {}
    for run in sorted(runs, key=lambda r: (str(r.started_at or ""), r.run_id)):
        latest[(run.study_id, gpu_id(run.gpu_name))] = run.run_id
    out = []
    for run in runs:
        plan = Plan.from_stored(run.plan_json) if run.run_id == latest[(run.study_id, gpu_id(run.gpu_name))] else None
        if plan is not None:
            out.append((run, plan))
    return out


def unreplayed_points(db: str | Path) -> list[dict[str, Any]]:
    """The measured points of the latest calibrated runs that the ledger leaves out because the replay does
    not model them (`unreplayed`): one row per study and reason, with the count, as `ledger_fit.not_validated`."""
    from runner.store.store import Store

    with Store(db, read_only=True) as store:
        return _unreplayed(store, _latest_plans(store))


def _unreplayed(store: Store, plans: list[tuple[RunRecord, Plan]]) -> list[dict[str, Any]]:
    groups: dict[tuple[str, str], list[str]] = defaultdict(list)
    for run, plan in plans:
        reasons = {p.id: why for s in plan.launches for p in s.points if (why := unreplayed(p)) is not None}
        for point in store.points(run.run_id):
            if point.status == "ok" and point.point_id in reasons:
                groups[(run.study_id, reasons[point.point_id])].append(point.point_id)
    return [{"study": study, "reason": reason, "n": len(ids), "points": sorted(ids)}
            for (study, reason), ids in sorted(groups.items())]


def whole_window(records: Sequence[Any], concurrency: int) -> PointSummary:
    """The point's statistics over its whole measured window (ramp and drain included), as the model
    replays it; the stored summary holds the steady phase where the point has one."""
    from runner.checks.stats import summarize

    return summarize(records, concurrency, burst=True)


def _burst(sends: Sequence[tuple[float, float | None]], slots: int) -> float | None:
    """The opening burst's last first token from the first measured send. Only the first `slots`
    requests sent are the burst (later ones were sent as slots freed); none for a single slot or
    where a burst request failed or has no first token."""
    burst = sends[:slots]
    firsts = [f for _, f in burst if f is not None]
    if slots < 2 or len(burst) < slots or len(firsts) < slots:
        return None
    return max(firsts) - burst[0][0]


# ---- predictions for a plan --------------------------------------------------------------------


def gpu_id(name: str | None) -> str:
    """A GPU's identity across names: its hardware-table key ("NVIDIA H100 80GB HBM3" -> h100-sxm), else
    its label."""
    return hardware_key(name) or _gpu_label(name)


def read_calibrations(db: str | Path) -> list[Calibration]:
    """Every calibrated run's measured ceilings, with or without points (a GPU's first run may have none)."""
    from runner.store.store import Store

    with Store(db, read_only=True) as store:
        return store_calibrations(store)


def store_calibrations(store: Store) -> list[Calibration]:
    """`read_calibrations` from an open store."""
    return [Calibration(_gpu_label(r.gpu_name), float(r.bandwidth_Bps), float(r.flops_bf16), r.run_id)
            for r in store.runs()
            if r.calibrated and r.bandwidth_Bps and r.flops_bf16 and r.bandwidth_Bps > 0 and r.flops_bf16 > 0]


@dataclass(frozen=True)
class PointPrediction:
    """The model's prediction for one plan point: METRICS (None where it cannot predict) and, then, why."""

    values: dict[str, float | None]
    note: str = ""
    fit_key: str = ""  # the fit its numbers come from, and the GPUs fitted on (a `predict = "model"` records it)
    card: str = ""  # the card the fit is priced on, and how it was found (compiler.target_card)

    @classmethod
    def none(cls, note: str) -> PointPrediction:
        """No prediction: every metric None, and why."""
        return cls(dict.fromkeys(METRICS), note)


def _rekey(p: StoredPoint, gpu: str) -> StoredPoint:
    return replace(p, key=replace(p.key, gpu=gpu))


def predict_points(
    plan: Plan, points: Sequence[StoredPoint], hardware: str | None = None, root: Path = REPO,
    calibrations: Sequence[Calibration] = (),
) -> dict[str, PointPrediction]:
    """A prediction for every point of a plan (None values and why for one the replay does not model) on
    `hardware` (a GPU name; the plan's `hardware` by default), with the newest vLLM version stored. Each key
    (vLLM version, model family, engine options) is fitted on the points of every GPU that measured it,
    each point priced on its own run's card, and priced on the target's card (`compiler.target_card`: the
    median of its calibrations, from `calibrations` and the points' runs, matched through the hardware
    table; else its spec sheet scaled). A key the target GPU never measured says so in the note."""
    want = hardware or plan.hardware
    target = gpu_id(want)
    loads = plan_loads(plan, root)
    on_gpu = [p for p in points if gpu_id(p.key.gpu) == target]
    vllm = max((p.key.vllm_version for p in on_gpu or points), default=None, key=_version_tuple)
    if vllm is None:
        note = f"no calibrated run in the database to fit the step-time model on (for {want})"
        return {p.id: PointPrediction.none(unreplayed(p) or note) for s in plan.launches for p in s.points}
    out: dict[str, PointPrediction] = {p.id: PointPrediction.none(why) for s in plan.launches for p in s.points
                                       if (why := unreplayed(p)) is not None}
    needed = {key_of(ANY_GPU, vllm, s, e) for e, s, _ in loads.values()}
    used = [q for p in points if p.key.vllm_version == vllm and (q := _rekey(p, ANY_GPU)).key in needed]
    fitted = fit_keys(used)
    gpus_of: dict[ModelKey, set[str]] = defaultdict(set)
    for p in points:
        gpus_of[replace(p.key, gpu=ANY_GPU)].add(p.key.gpu)
    runs = {p.run_id: Calibration(p.key.gpu, p.card.bandwidth_Bps, p.card.flops_per_s, p.run_id) for p in points}
    for c in calibrations:
        runs.setdefault(c.run_id, c)
    try:
        priced: PricedCard | str = target_card(want, list(runs.values()))
    except ValueError as exc:
        priced = str(exc)
    for pid, (engine, shape, load) in loads.items():
        key = key_of(ANY_GPU, vllm, shape, engine)
        gpus = sorted(gpus_of[key])
        if key not in fitted:
            out[pid] = PointPrediction.none(f"no stored run measured {key_of(want, vllm, shape, engine).label()}")
        elif isinstance(priced, str):
            out[pid] = PointPrediction.none(f"{key_of(want, vllm, shape, engine).label()}: measured on "
                                            f"{', '.join(gpus)} only, and {priced}")
        else:
            measured = any(gpu_id(g) == target for g in gpus)
            note = "" if measured else f"not measured on {target}: fitted on {', '.join(gpus)}'s points, {priced.note}"
            out[pid] = _prediction(predict(shape, load, engine, priced.card, fitted[key]), note,
                                   f"{key.label()} (fitted on {', '.join(gpus)})", f"{target}: {priced.note}")
    return out


def _prediction(pr: StepPrediction, note: str = "", fit_key: str = "", card: str = "") -> PointPrediction:
    return PointPrediction({"output_throughput": pr.output_throughput, "tpot_s": pr.tpot_s, "ttft_s": pr.ttft_s}, note,
                           fit_key, card)


def key_of(gpu: str, vllm: str, shape: ModelShape, engine: EngineShape) -> ModelKey:
    return ModelKey(gpu, vllm, shape.family, engine.enforce_eager, engine.kv_cache_dtype)


def _version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", version))

"""Cross-reference checks a schema cannot express: names that must exist, selectors that must
match exactly one point, expressions over known names, model folders that must load, predictions
that must evaluate (compiler.predict_resolve).
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from compiler.capacity import wave_requests
from compiler.claims import find_sources, load_catalog, unknown_claims
from compiler.engine_options import PARALLEL_OPTIONS, option_table, parallel_gpus, value_problem
from compiler.expr import ExprError, parse
from compiler.hardware import HARDWARE, HardwareError, get_hardware
from compiler.metrics import METRICS
from compiler.model_value import MODEL, check_model_values
from compiler.modelconfig import ModelError, load_model
from compiler.predict_env import env_names
from compiler.predict_resolve import check_predictions
from compiler.select import merge, resolve
from compiler.study import Hypothesis, Study, Where
from compiler.workload_check import check_workloads

RUNNER_OWNED = {"host", "port", "api-key", "model"}
Finding = tuple[str, str]  # (dotted key, message)


def cross_check(study: Study, directory: Path) -> list[Finding]:
    """Every cross-reference problem of a schema-valid study, its model paths relative to `directory`."""
    return [
        *_check_hardware(study),
        *_check_models(study, directory),
        *_check_engine_keys(study),
        *_check_design(study),
        *_check_search(study),
        *_check_hypotheses(study),
        *check_workloads(study, directory),
        *check_predictions(study, directory),
        *check_model_values(study),
        *_check_claims(study, directory),
    ]


def _check_claims(study: Study, directory: Path) -> Iterator[Finding]:
    """Every id in a hypothesis' `claims` must be a claim of a sources file above the study's folder."""
    named = [(i, h) for i, h in enumerate(study.hypothesis) if h.claims]
    if not named:
        return
    folder = find_sources(directory)
    if folder is None:  # a copy outside the repository: said by `claims_warnings`, not refused
        return
    catalog = load_catalog(folder)
    for index, hyp in named:
        for claim_id in unknown_claims(hyp.claims, catalog):
            close = difflib.get_close_matches(claim_id, catalog.ids, n=1, cutoff=0.6)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            yield f"hypothesis[{index}].claims", f"unknown claim '{claim_id}' in {folder}{hint}"


def claims_warnings(study: Study, directory: Path) -> list[Finding]:
    """Claims named where no sources/ folder is found above the study: they cannot be checked."""
    if find_sources(directory) is not None:
        return []
    return [(f"hypothesis[{i}].claims", "its claims are not checked: no sources/ folder here or above (claims "
             "files, one per document)") for i, h in enumerate(study.hypothesis) if h.claims]


def study_warnings(study: Study) -> list[Finding]:
    """Things that are allowed but probably not meant; printed by validate and plan, never fatal."""
    found: list[Finding] = [
        (f"arms.{name}.balance", "balance has no effect on an arm with one replica")
        for name, arm in study.arms.items() if arm.replicas == 1 and "balance" in arm.model_fields_set
    ]
    load = study.load
    if load.concurrency is None or load.burst:
        return found
    turns = most_turns(study)
    for index, concurrency in enumerate(load.concurrency):
        requests = load.requests_at(index)
        if math.ceil(requests / turns) <= concurrency:
            key = f"load.requests[{index}]" if isinstance(load.requests, list) else "load.requests"
            more = "requests than the concurrency" if turns == 1 else "conversations than the concurrency"
            found.append((
                key,
                f"{_counted(requests, turns)} at concurrency {concurrency} is one wave, not a steady state: "
                f"give more {more}, or set load.burst = true to measure one wave on purpose",
            ))
    return found


def most_turns(study: Study) -> int:
    """The most turns of any workload: a closed-loop slot holds one conversation of that many requests."""
    return max((w.turns for w in study.workloads.values()), default=1)


def _counted(requests: int, turns: int) -> str:
    """`480 requests`, or for a multi-turn workload `480 requests (120 conversations of 4 turns)`: the
    conversations as a point sends them, whole (`conversation_requests`)."""
    if turns == 1:
        return f"{requests} requests"
    return f"{requests} requests ({math.ceil(requests / turns)} conversations of {turns} turns)"


def vllm_options() -> frozenset[str]:
    return frozenset(option_table())


def option_name(key: str) -> str:
    return key.replace("_", "-")


def _check_engine_keys(study: Study) -> Iterator[Finding]:
    tables: list[tuple[str, dict[str, Any]]] = [("engine", study.engine)]
    tables += [(f"arms.{name}", arm.args) for name, arm in study.arms.items()]
    known = vllm_options()
    for prefix, table in tables:
        for key, value in table.items():
            name = option_name(key)
            path = f"{prefix}.{key}"
            if name in RUNNER_OWNED:
                yield path, f"`{name}` is set by the runner (127.0.0.1, a free port, a random key); remove it"
            elif name not in known:
                close = difflib.get_close_matches(name, known, n=1, cutoff=0.75)
                hint = f"; did you mean '{close[0].replace('-', '_')}'?" if close else ""
                yield path, f"unknown `vllm serve` option{hint}"
            elif isinstance(value, list) and any(isinstance(v, dict) for v in value):
                yield path, "lists of tables are not `vllm serve` values"
            else:
                problem = value_problem(name, value)
                if problem:
                    yield path, f"`--{name}` {problem}"


def _check_design(study: Study) -> Iterator[Finding]:
    """Parallel sizes are positive integers; every launch fits design.gpus; a budget can be spent."""
    tables: list[tuple[str, dict[str, Any]]] = [("engine", study.engine)]
    tables += [(f"arms.{name}", arm.args) for name, arm in study.arms.items()]
    bad = False
    for prefix, table in tables:
        for key, value in table.items():
            if key.replace("-", "_") not in PARALLEL_OPTIONS:
                continue
            if value_problem(option_name(key), value) is not None:
                bad = True  # reported by the engine option check
                continue
            number = value if isinstance(value, int) and not isinstance(value, bool) else None
            if isinstance(value, str) and value.strip().lstrip("-").isdigit():
                number = int(value)
            if number is None or number < 1:
                bad = True
                yield f"{prefix}.{key}", f"should be a positive integer (GPUs per server), not {value!r}"
    gpus = study.design.gpus
    if gpus is not None and not bad:
        for name, arm in study.arms.items():
            per_server = parallel_gpus({**study.engine, **arm.args})
            need = arm.replicas * per_server
            if need > gpus:
                yield f"arms.{name}.replicas", (
                    f"a launch of this arm needs {need} GPUs ({arm.replicas} replica(s) x {per_server} per server), "
                    f"more than design.gpus = {gpus}"
                )
    budget = study.design.budget
    if budget is None:
        return
    own = [name for name, arm in study.arms.items() if arm.launches is not None]
    for name in own:
        yield f"arms.{name}.launches", (
            "per-arm launches and design.budget don't mix: the budget adds blocks of every arm; "
            "set load.launches instead"
        )
    if study.load.launches < 2:
        yield "load.launches", (
            "a sequential design needs at least 2 launches per arm before its first decision "
            "(one launch gives no interval)"
        )
    elif budget.blocks < study.load.launches:
        yield "design.budget.blocks", (
            f"{budget.blocks} blocks is fewer than load.launches = {study.load.launches} required blocks"
        )


def _check_hardware(study: Study) -> Iterator[Finding]:
    try:
        get_hardware(study.study.hardware)
    except HardwareError:
        hint = _did_you_mean(study.study.hardware.lower(), HARDWARE)
        yield "study.hardware", (
            f"unknown hardware {study.study.hardware!r}{hint} (known: {', '.join(sorted(HARDWARE))})"
        )


def _check_models(study: Study, directory: Path) -> Iterator[Finding]:
    paths = [("model.path", study.model.path)]
    paths += [(f"arms.{name}.model", arm.model) for name, arm in study.arms.items()]
    for key, rel in paths:
        if rel is None:
            continue
        try:
            load_model(directory / rel)
        except ModelError as exc:
            yield key, str(exc)
    if study.model.tokenizer is not None and not (directory / study.model.tokenizer).is_dir():
        yield "model.tokenizer", f"no such folder: {study.model.tokenizer}"


NEEDS_SLO = {
    "goodput": "goodput counts the requests that meet the study's [slo] (without one it is request_throughput)",
    "slo_attainment": "slo_attainment is the share of requests that meet the study's [slo]",
    "capacity": "capacity is the highest load whose slo_attainment holds [slo].attainment",
}


def _check_search(study: Study) -> Iterator[Finding]:
    """A capacity search needs an [slo] to hold and one server across its probes."""
    if study.load.search is None:
        return
    if study.slo is None:
        yield "load.search", "a capacity search needs an [slo] table: a probe holds when its requests meet it"
    if study.load.server == "per-point":
        yield "load.server", "a capacity search probes one server launch: use server = \"per-arm\""
    yield from _check_search_waves(study)


def _check_search_waves(study: Study) -> Iterator[Finding]:
    """A concurrency search without `waves` whose top probe is one wave or less (in conversations, multi-turn):
    every probe at hi fails steady_state, an invalid probe stops the search, so it can never resolve."""
    load, search = study.load, study.load.search
    if search is None or search.over != "concurrency" or search.waves is not None or load.burst:
        return
    requests, hi, turns = load.requests_at(0), int(search.hi), most_turns(study)
    if math.ceil(requests / turns) > hi:
        return
    yield "load.requests", (
        f"{_counted(requests, turns)} at the search's top concurrency {hi} is one wave or less: every probe at hi "
        "fails the steady_state check, which stops the search unresolved at its first probe. Fix: "
        f"load.search.waves = 3 (every probe sends 3 waves of its own concurrency), or load.requests >= {wave_requests(3, hi, turns)} "
        f"(3 waves at {hi}" + (f" of {turns}-turn conversations)" if turns > 1 else ")")
    )


def _check_metric_fits(study: Study, metric: str, key: str) -> Iterator[Finding]:
    """Metrics that need an [slo] or a search, and point metrics a search study has no fixed point for."""
    if metric in NEEDS_SLO and study.slo is None:
        yield key, f"{NEEDS_SLO[metric]}: add an [slo] table"
    level = METRICS[metric].level
    if level == "search" and study.load.search is None:
        yield key, "capacity needs a capacity search: give load.search instead of a ladder"
    elif level == "point" and study.load.search is not None:
        yield key, "a capacity search study has no fixed load points: predict `capacity` or a server metric"


def _check_server_selection(hyp: Hypothesis, base: str) -> Iterator[Finding]:
    """A server metric is read once per server launch: its selector (and each side of its ratio) names an
    arm only, never a workload or a load level (a point of the ladder is not what it measures)."""
    if METRICS[hyp.metric].level != "server":
        return
    ratio = hyp.predict.ratio or ()
    sides = [(f"{base}.where", hyp.where)] + [
        (f"{base}.predict.ratio", side) for side in ratio if isinstance(side, Where)]
    for key, where in sides:
        named = [name for name in ("workload", "concurrency", "rate") if getattr(where, name) is not None]
        if named:
            yield f"{key}.{named[0]}", (
                f"{hyp.metric} is a server metric, one value per server launch: select it by arm only, "
                f"not by {' or '.join(named)}")
            return


def _check_premises(study: Study, index: int, hyp: Hypothesis) -> Iterator[Finding]:
    """`requires` names other hypotheses of the study, each a premise that has none of its own (one level:
    a premise is judged by its own interval, never by another premise)."""
    by_id = {h.id: h for h in study.hypothesis}
    for i, name in enumerate(hyp.requires):
        key = f"hypothesis[{index}].requires[{i}]"
        if name == hyp.id:
            yield key, f"hypothesis '{hyp.id}' cannot require itself"
        elif name not in by_id:
            yield key, f"unknown hypothesis '{name}'{_did_you_mean(name, by_id)}"
        elif by_id[name].requires:
            yield key, (f"'{name}' has premises of its own (requires {by_id[name].requires}): a premise must be "
                        "decided by its own measurement")


def _check_hypotheses(study: Study) -> Iterator[Finding]:
    seen: set[str] = set()
    for index, hyp in enumerate(study.hypothesis):
        base = f"hypothesis[{index}]"
        if hyp.id in seen:
            yield f"{base}.id", f"duplicate hypothesis id '{hyp.id}'"
        seen.add(hyp.id)
        yield from _check_premises(study, index, hyp)
        if hyp.metric not in METRICS:
            close = difflib.get_close_matches(hyp.metric, METRICS, n=1, cutoff=0.6)
            hint = f"; did you mean '{close[0]}'?" if close else " (see `studyc metrics`)"
            yield f"{base}.metric", f"unknown metric '{hyp.metric}'{hint}"
            continue
        misfit = list(_check_metric_fits(study, hyp.metric, f"{base}.metric"))
        misfit += list(_check_server_selection(hyp, base))
        if misfit:
            yield from misfit
            continue
        yield from _check_where(study, hyp.where, f"{base}.where")
        ratio = hyp.predict.ratio
        sides: list[tuple[str, Where]] = [(f"{base}.where", hyp.where)]
        if ratio is not None:
            sides = []
            for i, side in enumerate(ratio):
                key = f"{base}.predict.ratio"
                if isinstance(side, str) and side not in study.arms:
                    yield key, f"unknown arm '{side}'{_did_you_mean(side, study.arms)}"
                    break
                if isinstance(side, Where):
                    yield from _check_where(study, side, key)
                sides.append((f"{key}[{i}]", merge(hyp.where, side)))
            else:
                if ratio[0] == ratio[1]:
                    yield f"{base}.predict.ratio", "numerator and denominator are the same"
        for key, where in sides:
            try:
                resolve(study, where, hyp.metric)
            except ValueError as exc:
                yield key, str(exc)
        yield from _check_expressions(hyp.predict.value, hyp.predict.range, f"{base}.predict")


def _check_where(study: Study, where: Where, key: str) -> Iterator[Finding]:
    if where.arm is not None and where.arm not in study.arms:
        yield f"{key}.arm", f"unknown arm '{where.arm}'{_did_you_mean(where.arm, study.arms)}"
    if where.workload is not None and where.workload not in study.workloads:
        yield f"{key}.workload", f"unknown workload '{where.workload}'{_did_you_mean(where.workload, study.workloads)}"
    load = study.load
    if load.search is not None and (where.concurrency is not None or where.rate is not None):
        yield f"{key}.{'rate' if where.concurrency is None else 'concurrency'}", (
            "a capacity search has no ladder to select a level from: leave the level out")
    elif where.concurrency is not None:
        if load.concurrency is None:
            yield f"{key}.concurrency", "this study's ladder is `load.rate`; select by `rate`"
        elif where.concurrency not in load.concurrency:
            yield f"{key}.concurrency", f"{where.concurrency} is not in load.concurrency {load.concurrency}"
    elif where.rate is not None:
        if load.rate is None:
            yield f"{key}.rate", "this study's ladder is `load.concurrency`; select by `concurrency`"
        elif float(where.rate) not in [float(r) for r in load.rate]:
            yield f"{key}.rate", f"{where.rate} is not in load.rate {load.rate}"


def _check_expressions(value: Any, bounds: Any, key: str) -> Iterator[Finding]:
    items = [("value", value)] if value is not None else []
    items += [(f"range[{i}]", b) for i, b in enumerate(bounds or ())]
    for name, item in items:
        if not isinstance(item, str) or (name == "value" and item == MODEL):
            continue
        try:
            expr = parse(item)
        except ExprError as exc:
            yield f"{key}.{name}", f"bad expression: {exc}"
            continue
        unknown = sorted(expr.names - env_names())
        for bad in unknown:
            hint = _did_you_mean(bad, env_names())
            yield f"{key}.{name}", f"unknown name '{bad}' in expression{hint}"


def _did_you_mean(word: str, known: Any) -> str:
    close = difflib.get_close_matches(word, list(known), n=1, cutoff=0.6)
    return f"; did you mean '{close[0]}'?" if close else ""

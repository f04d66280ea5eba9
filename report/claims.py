"""Each claim of each source document against the hypotheses that name it: faithful, approximate or untested.

A hypothesis tests a claim faithfully when the run that scored it (or, not yet run, its plan) has the claim's
GPU, model shape, workload (lengths, dataset kind and cache state), load, deployment (GPUs, replicas) and
engine options. What cannot be matched on the lent machines (the engine version, the driver, dummy weights
where the claim does not depend on the weights' values, repeats where launches carry the replication) is
listed but does not demote it. Every difference is worked out from the claim's conditions and the plan and
run, never typed by hand. Pure: catalog, study contexts and scores in, rows out.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from compiler.claims import Catalog, Claim, Conditions, Document, Drawn
from compiler.hardware import HardwareError, get_hardware
from compiler.plan import HypothesisSide, HypothesisStep, Launch, Plan, PointStep
from compiler.workload import Histogram
from report.pages.page_models import ClaimLine, ClaimsTable, ClaimTestCell, StudyClaim
from report.scoring.context import StudyContext
from report.scoring.score_model import Score

Status = Literal["faithful", "approximate", "untested"]
NO_HYPOTHESIS = "no hypothesis tests it yet"


@dataclass(frozen=True)
class Difference:
    """One condition in which a test differs from its claim."""

    name: str  # gpu, model, output_len, ...
    test: str  # what the run or plan had
    claim: str  # what the claim was made under
    demotes: bool  # False: listed only (engine version, driver, dummy weights, repeats)

    def __str__(self) -> str:
        listed = "" if self.demotes else "; listed, not demoting"
        return f"{self.name}: {self.test} (claim: {self.claim}{listed})"


@dataclass(frozen=True)
class Test:
    """One hypothesis that names the claim, with its verdict and how its run differs from the claim."""

    study: str
    hypothesis: str
    verdict: str
    gpu: str  # the run's GPU, or "planned for <hardware>" when not run
    run_id: str | None
    differences: tuple[Difference, ...]

    @property
    def faithful(self) -> bool:
        return not any(d.demotes for d in self.differences)

    @property
    def demoting(self) -> int:
        return sum(d.demotes for d in self.differences)


@dataclass(frozen=True)
class ClaimRow:
    document: str
    claim: str
    section: str
    text: str
    numbers: dict[str, float]
    status: Status
    differs: tuple[str, ...]  # of the test shown first: every difference, demoting or not
    reason: str  # why untested ("" otherwise)
    tests: tuple[Test, ...]  # the one the status rests on first

    def json(self) -> dict[str, Any]:
        return {
            "document": self.document, "claim": self.claim, "section": self.section, "text": self.text,
            "numbers": self.numbers, "status": self.status, "differs": list(self.differs), "reason": self.reason,
            "hypotheses": [{"study": t.study, "hypothesis": t.hypothesis, "verdict": t.verdict, "gpu": t.gpu,
                            "faithful": t.faithful, "differs": [str(d) for d in t.differences]} for t in self.tests],
        }


def claim_rows(catalog: Catalog, contexts: Sequence[StudyContext], scores: Mapping[str, Sequence[Score]],
               *, measured: bool = True) -> list[ClaimRow]:
    """One row per claim of every document, in document then file order. `measured`: a test is faithful
    only on a run (a hypothesis not yet run is compared by its plan, and differs by "run: not run");
    False compares plans alone (no database given)."""
    tests: dict[str, list[Test]] = {}
    for ctx in contexts:
        verdicts = {s.hypothesis: s.verdict for s in scores.get(ctx.study.study.id, ())}
        plan = ctx.plan or _compiled(ctx)  # not run: the study file's plan, compiled once for all its claims
        for hyp in ctx.study.hypothesis:
            for claim_id in hyp.claims:
                found = catalog.claim(claim_id)
                step = ctx.hypotheses.get(hyp.id)
                if found is None or step is None:
                    continue
                tests.setdefault(claim_id, []).append(
                    test_of(found[1].conditions, ctx, plan, step, verdicts.get(hyp.id, "not run"), measured))
    return [row_of(doc, claim, tests.get(claim.id, [])) for doc in catalog.documents for claim in doc.claims]


def row_of(doc: Document, claim: Claim, tests: Sequence[Test]) -> ClaimRow:
    """The claim's status from its tests: faithful if one is, else approximate; untested with none."""
    ordered = tuple(sorted(tests, key=lambda t: (t.demoting, t.verdict == "not run", t.study, t.hypothesis)))
    if not ordered:
        status: Status = "untested"
    else:
        status = "faithful" if ordered[0].faithful else "approximate"
    return ClaimRow(
        document=doc.id, claim=claim.id, section=claim.section, text=claim.text, numbers=dict(claim.numbers),
        status=status, differs=tuple(str(d) for d in ordered[0].differences) if ordered else (),
        reason="" if ordered else (claim.untested or NO_HYPOTHESIS), tests=ordered,
    )


def _compiled(ctx: StudyContext) -> Plan:
    from compiler.plan_compile import compile_study

    return compile_study(ctx.loaded)


def test_of(cond: Conditions, ctx: StudyContext, plan: Plan, step: HypothesisStep, verdict: str,
            measured: bool = True) -> Test:
    """One hypothesis as a test of a claim: its verdict, its run's GPU and every difference from the claim,
    read from `plan` (the run's, or the study file's where it has not run)."""
    run = ctx.run
    gpu = _gpu_name(run.gpu_name) if run is not None and run.gpu_name else None
    planned = ctx.study.study.hardware
    differences = differences_of(cond, plan, step, gpu=gpu, planned=planned,
                                 vllm=run.vllm_version if run else None, driver=run.driver_version if run else None,
                                 dummy=ctx.study.model.load_format == "dummy")
    if measured and run is None:
        differences.insert(0, Difference("run", "not run", "a run", True))
    return Test(study=ctx.study.study.id, hypothesis=step.id, verdict=str(verdict),
                gpu=gpu or (f"planned for {planned}" if run is None else "not recorded"),
                run_id=run.run_id if run else None, differences=tuple(differences))


def _gpu_name(name: str) -> str:
    try:
        return get_hardware(name).name
    except HardwareError:
        return name


def differences_of(cond: Conditions, plan: Plan, step: HypothesisStep, *, gpu: str | None, planned: str,
                   vllm: str | None, driver: str | None, dummy: bool) -> list[Difference]:
    """Every condition the claim states in which the hypothesis' plan (and run) differs from it."""
    sides = [step.numerator] + ([step.denominator] if step.denominator else [])
    first = {x.arm: x for x in reversed(plan.launches)}  # each arm's first launch
    launches = [first[arm] for arm in dict.fromkeys(s.arm for s in sides) if arm in first]
    points = [p for p in plan.points if any(_on_side(p, side) for side in sides)]
    out: list[Difference] = []

    def differ(name: str, test: object, claim: object, demotes: bool = True) -> None:
        out.append(Difference(name, _text(test), _text(claim), demotes))

    if cond.gpu is not None:
        have = gpu if gpu is not None else _gpu_name(planned)
        if have != _gpu_name(cond.gpu):
            differ("gpu", have if gpu is not None else f"{have} (planned)", cond.gpu)
    if cond.gpus is not None and launches and max(x.gpus for x in launches) != cond.gpus:
        differ("gpus", max(x.gpus for x in launches), cond.gpus)
    if cond.replicas is not None and launches and max(x.replicas for x in launches) != cond.replicas:
        differ("replicas", max(x.replicas for x in launches), cond.replicas)
    if cond.model is not None:
        models = sorted({os.path.basename(x.model_dir.rstrip("/")).lower() for x in launches})
        wanted_models = {m.lower() for m in cond.model}
        if not models or any(m not in wanted_models for m in models):
            differ("model", ", ".join(models) or "-", ", ".join(cond.model))
    per_point = step.level != "server"  # a server metric (the machine's ceilings, KV capacity) has no workload
    for name in ("input_len", "output_len") if per_point else ():
        claimed = getattr(cond, name)
        if claimed is not None and claimed != "any":
            have_len = sorted({_length(p, name) for p in points})
            if not have_len or any(not _length_matches(h, claimed) for h in have_len):
                differ(name, ", ".join(have_len) or "-", _claim_length(claimed))
    if cond.dataset is not None and per_point:
        kinds = sorted({dataset_kind(p) for p in points})
        if kinds != [cond.dataset]:
            differ("dataset", ", ".join(kinds) or "-", cond.dataset)
    if cond.cache not in (None, "any") and per_point:
        caches = sorted({p.cache for p in points})
        claimed_caches = sorted({cond.cache} if isinstance(cond.cache, str) else set(cond.cache or ()))
        if caches != claimed_caches:
            differ("cache", ", ".join(caches) or "-", ", ".join(claimed_caches))
    _load(cond, sides, out)
    for key, value in (cond.engine or {}).items():
        have_values = sorted({_text(engine_value(x, key)) for x in launches})
        if have_values != [_text(value)]:
            differ(f"engine {key}", ", ".join(have_values) or "-", value)
    if cond.weights == "real" and dummy:
        differ("weights", "dummy", "real")
    elif dummy:
        differ("weights", "dummy", "real weights", demotes=False)
    if cond.vllm is not None and vllm != cond.vllm:
        differ("vllm", vllm or "not run", cond.vllm, demotes=False)
    if cond.driver is not None and driver is not None and driver != cond.driver:
        differ("driver", driver, cond.driver, demotes=False)
    if cond.repeats is not None and plan.design.repeats != cond.repeats:
        launches_per_arm = max(plan.design.launches.values(), default=1)
        differ("repeats", f"{plan.design.repeats} per launch x {launches_per_arm} launches", cond.repeats,
               demotes=False)
    return out


def _on_side(point: PointStep, side: HypothesisSide) -> bool:
    """Whether a point is one a side rests on (a side leaving workload or load open takes any)."""
    return point.arm == side.arm and side.workload in (None, point.workload) and (
        side.concurrency in (None, point.concurrency)) and side.rate_rps in (None, point.rate_rps)


def _load(cond: Conditions, sides: Sequence[HypothesisSide], out: list[Difference]) -> None:
    if all(s.concurrency is None and s.rate_rps is None for s in sides):
        return  # a server metric: no load level
    levels = sorted({s.concurrency for s in sides if s.concurrency is not None})
    rates = sorted({s.rate_rps for s in sides if s.rate_rps is not None})
    if cond.concurrency is not None and (rates or any(c not in cond.concurrency for c in levels)):
        have = ", ".join([f"c{c}" for c in levels] + [f"{r:g} req/s" for r in rates])
        out.append(Difference("concurrency", have, ", ".join(f"c{c}" for c in cond.concurrency), True))
    if cond.rate is not None and (levels or any(r not in cond.rate for r in rates)):
        have = ", ".join([f"c{c}" for c in levels] + [f"{r:g} req/s" for r in rates])
        out.append(Difference("rate", have, ", ".join(f"{r:g} req/s" for r in cond.rate), True))


def dataset_kind(point: PointStep) -> str:
    """random (no reuse), shared-prefix, multi-turn or trace: how the point's prompts reuse tokens."""
    shape = point.shape
    if shape is not None and shape.trace is not None:
        return "trace"
    if shape is not None and shape.turns > 1:
        return "multi-turn"
    return "shared-prefix" if point.prefix_len > 0 else "random"


def _length(point: PointStep, name: str) -> str:
    """A point's length as text: `1024` when fixed, `drawn (max 96)` when drawn."""
    shape = point.shape
    dist = None if shape is None else (shape.input if name == "input_len" else shape.output)
    if dist is None or isinstance(dist, int):
        return str(point.input_len if name == "input_len" else point.output_len)
    top = max(dist.values or ()) if isinstance(dist, Histogram) else dist.max
    return "drawn" + (f" (max {top})" if top is not None else "")


def _length_matches(have: str, claimed: int | Drawn | str) -> bool:
    if isinstance(claimed, int):
        return have == str(claimed)
    if not have.startswith("drawn"):
        return False
    return not isinstance(claimed, Drawn) or claimed.max is None or have == f"drawn (max {claimed.max})"


def _claim_length(claimed: int | Drawn | str) -> str:
    if isinstance(claimed, Drawn):
        return "drawn" + (f" (max {claimed.max})" if claimed.max is not None else "")
    return str(claimed)


_ENGINE_DEFAULTS = {"enable_prefix_caching": "prefix_caching", "enable_chunked_prefill": "chunked_prefill",
                    "enforce_eager": "enforce_eager", "max_num_seqs": "max_num_seqs",
                    "max_num_batched_tokens": "max_num_batched_tokens"}


def engine_value(launch: Launch, key: str) -> object:
    """The launch's value of a `vllm serve` option (CLI name with underscores): from its parsed engine
    settings where the plan keeps them (defaults included), else from its argv (None: not given)."""
    key = key.replace("-", "_")
    if key == "kv_cache_dtype":
        return launch.kv_cache_dtype
    if key in _ENGINE_DEFAULTS:
        return getattr(launch.engine, _ENGINE_DEFAULTS[key])
    flag = "--" + key.replace("_", "-")
    argv = list(launch.argv)
    for i, arg in enumerate(argv):
        if arg == flag:
            nxt = argv[i + 1] if i + 1 < len(argv) else ""
            return True if not nxt or nxt.startswith("--") else nxt
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
        if arg == "--no-" + flag[2:]:
            return False
    return None


def _text(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    return "-" if value is None else str(value)


def counts(rows: Sequence[ClaimRow]) -> dict[str, dict[str, int]]:
    """document -> status -> how many claims."""
    out: dict[str, dict[str, int]] = {}
    for row in rows:
        per = out.setdefault(row.document, {"faithful": 0, "approximate": 0, "untested": 0})
        per[row.status] += 1
    return out


def claims_tables(rows: Sequence[ClaimRow], catalog: Catalog, href: Callable[[str], str]) -> tuple[ClaimsTable, ...]:
    """The index's tables: one per document, every claim, untested ones with their reason; `href` is a
    study id's page."""
    per = counts(rows)
    tables = []
    for doc in catalog.documents:
        mine = [r for r in rows if r.document == doc.id]
        n = per.get(doc.id, {})
        lines = tuple(ClaimLine(
            claim=r.claim, section=r.section, text=r.text, status=r.status, reason=r.reason,
            differs=r.differs,
            tests=tuple(ClaimTestCell(label=f"{t.study}/{t.hypothesis}", href=f"{href(t.study)}#h-{t.hypothesis}",
                                      verdict=t.verdict, gpu=t.gpu, faithful=t.faithful) for t in r.tests),
        ) for r in mine)
        summary = f"{len(mine)} claims: " + ", ".join(f"{n.get(s, 0)} {s}" for s in ("faithful", "approximate",
                                                                                      "untested"))
        tables.append(ClaimsTable(document=doc.id, title=doc.title, counts=summary, rows=lines))
    return tuple(tables)


def study_claims(rows: Sequence[ClaimRow], study_id: str) -> tuple[StudyClaim, ...]:
    """The claims a study's hypotheses test, each with the conditions in which that test differs."""
    return tuple(StudyClaim(claim=r.claim, document=r.document, text=r.text, hypothesis=t.hypothesis,
                            faithful=t.faithful, differs=tuple(str(d) for d in t.differences))
                 for r in rows for t in r.tests if t.study == study_id)

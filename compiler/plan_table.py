"""A plan as a readable table: blocks, launches (servers, GPUs), points, cache actions, estimated time."""

from __future__ import annotations

from base import format as fmt
from compiler.configurations import primed_configurations
from compiler.plan import HypothesisSide, HypothesisStep, Launch, Plan


def summary(plan: Plan) -> list[str]:
    """Design and cost lines: launches, blocks, server starts, GPUs per launch, the estimate."""
    design = plan.design
    required = [s for s in plan.launches if s.required]
    blocks = [b for b in design.blocks if b.required]
    points = sum(len(s.points) for s in required)
    searches = [q for s in required for q in s.searches]
    starts = sum(s.replicas for s in required)
    start_s = sum(s.estimated_start_s for s in required) + plan.prime_s
    primes = primed_configurations(required) if plan.prime_s else 0
    gpus = sorted({s.gpus for s in plan.launches})
    per_launch = "/".join(str(g) for g in gpus)
    lines = [
        f"  {len(blocks)} block(s) of {len(design.launches)} arm(s), {len(required)} launch(es), "
        f"{design.repeats} repeat(s) per launch, {points} point(s)"
        + (f", {len(searches)} capacity search(es) of up to {sum(q.probes for q in searches)} probe point(s)"
           if searches else "") + f"; block order seed {design.seed} (from {design.seed_from})",
        f"  {starts} server start(s)" + (f" and {primes} unmeasured prime start(s)" if primes else "")
        + f" ~{fmt.duration(start_s)}, GPUs per launch {per_launch}"
        + (f" of {design.gpus} available" if design.gpus is not None else ""),
        f"  estimated {fmt.duration(plan.estimated_s)} one launch at a time on {plan.hardware}"
        f" (server starts {100 * start_s / plan.estimated_s:.0f}%)" if plan.estimated_s else "",
    ]
    if design.budget is not None:
        extra = [b for b in design.blocks if not b.required]
        minutes = f", at most {design.budget.minutes:g} min" if design.budget.minutes is not None else ""
        lines.append(
            f"  sequential: up to {len(extra)} more block(s) while a hypothesis is undecided "
            f"(budget {design.budget.blocks} blocks{minutes}; all blocks {fmt.duration(plan.estimated_max_s)})"
        )
        cut = budget_cutoff(plan)
        if cut is not None:
            block, at_s = cut
            lines.append(
                f"  warning: by the estimate, block {block} would start {fmt.duration(at_s)} in, past the budget's "
                f"{design.budget.minutes:g} min: blocks {block}-{len(design.blocks)} run only if the run is faster "
                "(a resumed segment has minutes of its own)"
            )
    return [line for line in lines if line]


def budget_cutoff(plan: Plan) -> tuple[int, float] | None:
    """The first budget block that, by the estimate, would start once the budget's minutes are spent (the runner
    starts no budget block past them), and when it would start: primes, then every launch of the blocks
    before it. None: no minutes, or every block starts inside them."""
    budget = plan.design.budget
    if budget is None or budget.minutes is None:
        return None
    at_s = plan.prime_s
    for block in plan.design.blocks:
        if not block.required and at_s >= 60 * budget.minutes:
            return block.index, at_s
        at_s += sum(launch.estimated_s for launch in plan.launches if launch.block == block.index)
    return None


def format_plan(plan: Plan) -> str:
    lines = [
        f"plan {plan.study_id}: {plan.title}",
        f"  study file {plan.study_path} (sha256 {plan.study_sha256[:12]}), schema v{plan.schema_version}",
        *summary(plan),
        f"  estimate: {plan.estimate_basis}",
        "",
    ]
    block = 0
    for launch in plan.launches:
        if launch.block != block:
            block = launch.block
            kind = "" if launch.required else "  (sequential: only while undecided)"
            lines.append(f"block {block}{kind}")
        lines += _launch_lines(launch)
    for hyp in plan.hypotheses:
        lines.append(f"hypothesis {hyp.id}: {hyp.metric} {_sides(hyp)}, predicted {predicted(hyp)}")
    return "\n".join(lines).rstrip() + "\n"


def _launch_lines(launch: Launch) -> list[str]:
    servers = f"{launch.replicas} servers ({launch.balance}), " if launch.replicas > 1 else ""
    lines = [f"launch {launch.id}  [{launch.fingerprint}]  {servers}{launch.gpus} GPU(s), "
             f"start ~{fmt.duration(launch.estimated_start_s)}"]
    env = " ".join(f"{k}={v}" for k, v in sorted(launch.env.items()))
    lines.append(f"  vllm {' '.join(launch.argv)}" + (f"  (env {env})" if env else ""))
    if launch.expect_log:
        lines.append("  its log must say by ready: " + "; ".join(repr(t) for t in launch.expect_log))
    lines.append(f"  {'point':<44} {'cache':<6} {'requests':>8} {'warmup':>6} {'in/out':>11} {'est':>8}")
    for p in launch.points:
        shape = f"{p.input_len}/{p.output_len}"
        mark = "  not exchangeable: first send on a kept cache" if not p.exchangeable else ""
        lines.append(f"  {p.id:<44} {p.cache:<6} {p.requests:>8} {p.warmup:>6} {shape:>11} "
                     f"{fmt.duration(p.estimated_s):>8}{mark}")
    for q in launch.searches:
        t = q.template
        lines.append(f"  {q.id:<44} {t.cache:<6} {t.requests:>8} {t.warmup:>6} {t.input_len}/{t.output_len:<5} "
                     f"{fmt.duration(q.estimated_s):>8}  search {q.over} {q.lo:g}..{q.hi:g}, up to {q.probes} "
                     f"probes (hi, lo, then bisection), holds at slo_attainment >= {q.attainment:g}"
                     + (f", {q.waves} waves a probe" if q.waves is not None else ""))
    lines.append("")
    return lines


def predicted(hyp: HypothesisStep) -> str:
    """The hypothesis' prediction as written in the study (expressions not evaluated), in display units."""
    p = hyp.prediction
    unit = fmt.display_unit(hyp.unit, ratio=hyp.denominator is not None)
    low, high = p.range if p.range is not None else (None, None)
    return fmt.prediction(p.kind, unit=unit, relation=p.relation, value=p.value, low=low, high=high,
                          tolerance=p.tolerance)


def _sides(hyp: HypothesisStep) -> str:
    def count(side: HypothesisSide) -> str:
        if hyp.level == "server":
            return f"{len(side.servers)} server(s)"
        if hyp.level == "search":
            return f"{len(side.points)} capacity search(es)"
        on = f" on {len(side.launches)} launches" if len(side.launches) > 1 else ""
        return f"{len(side.points)} point(s){on}"

    if hyp.denominator is None:
        return f"on {count(hyp.numerator)}"
    return f"ratio of {count(hyp.numerator)} over {count(hyp.denominator)}"


def markdown_plan(plan: Plan) -> str:
    """The plan as GitHub markdown: one row per point, then the hypotheses and their points."""
    lines = [
        f"**{plan.study_id}**: {plan.title} ({plan.server_starts} server start(s), {len(plan.points)} point(s), "
        f"estimated {fmt.duration(plan.estimated_s)} on {plan.hardware})",
        "",
        "| launch | point | cache | requests | warmup | in/out | est | block | GPUs |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for launch in plan.launches:
        for p in launch.points:
            lines.append(f"| {launch.id} | {p.id} | {p.cache} | {p.requests} | {p.warmup} | "
                         f"{p.input_len}/{p.output_len} | {fmt.duration(p.estimated_s)} | {launch.block} | {launch.gpus} |")
        for q in launch.searches:
            t = q.template
            lines.append(f"| {launch.id} | {q.id} (search {q.over} {q.lo:g}..{q.hi:g}, up to {q.probes} probes) | "
                         f"{t.cache} | {t.requests} | {t.warmup} | {t.input_len}/{t.output_len} | "
                         f"{fmt.duration(q.estimated_s)} | {launch.block} | {launch.gpus} |")
    if plan.hypotheses:
        lines += ["", "| hypothesis | metric | measured on | predicted |", "|---|---|---|---|"]
        lines += [f"| {h.id} | {h.metric} | {_sides(h)} | {predicted(h)} |" for h in plan.hypotheses]
    return "\n".join(lines)

"""A plan as a readable table: servers, points, cache actions, request counts, estimated time."""

from __future__ import annotations

from compiler.plan import HypothesisSide, HypothesisStep, Plan


def _duration(seconds: float) -> str:
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"


def format_plan(plan: Plan) -> str:
    lines = [
        f"plan {plan.study_id}: {plan.title}",
        f"  study file {plan.study_path} (sha256 {plan.study_sha256[:12]}), schema v{plan.schema_version}",
        f"  {len(plan.servers)} server(s), {len(plan.points)} point(s), "
        f"estimated {_duration(plan.estimated_s)} on {plan.hardware}",
        f"  estimate: {plan.estimate_basis}",
        "",
    ]
    for server in plan.servers:
        lines.append(f"server {server.id}  [{server.fingerprint}]  start ~{_duration(server.estimated_start_s)}")
        env = " ".join(f"{k}={v}" for k, v in sorted(server.env.items()))
        lines.append(f"  vllm {' '.join(server.argv)}" + (f"  (env {env})" if env else ""))
        header = f"  {'point':<44} {'cache':<6} {'requests':>8} {'warmup':>6} {'in/out':>11} {'est':>8}"
        lines.append(header)
        for p in server.points:
            cache = "reset" if p.cache == "reset" else "keep"
            shape = f"{p.input_len}/{p.output_len}"
            lines.append(
                f"  {p.id:<44} {cache:<6} {p.requests:>8} {p.warmup:>6} {shape:>11} {_duration(p.estimated_s):>8}"
            )
        lines.append("")
    for hyp in plan.hypotheses:
        lines.append(f"hypothesis {hyp.id}: {hyp.metric} {_sides(hyp)}")
    return "\n".join(lines).rstrip() + "\n"


def _sides(hyp: HypothesisStep) -> str:
    def count(side: HypothesisSide) -> str:
        if hyp.level == "server":
            return f"{len(side.servers)} server(s)"
        return f"{len(side.points)} point(s)"

    if hyp.denominator is None:
        return f"on {count(hyp.numerator)}"
    return f"ratio of {count(hyp.numerator)} over {count(hyp.denominator)}"


def markdown_plan(plan: Plan) -> str:
    """The plan as GitHub markdown: one row per point, then the hypotheses and their points."""
    lines = [
        f"**{plan.study_id}**: {plan.title} ({len(plan.servers)} server(s), {len(plan.points)} point(s), "
        f"estimated {_duration(plan.estimated_s)} on {plan.hardware})",
        "",
        "| server | point | cache | requests | warmup | in/out | est |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    for server in plan.servers:
        for p in server.points:
            lines.append(f"| {server.id} | {p.id} | {p.cache} | {p.requests} | {p.warmup} | "
                         f"{p.input_len}/{p.output_len} | {_duration(p.estimated_s)} |")
    if plan.hypotheses:
        lines += ["", "| hypothesis | metric | measured on |", "|---|---|---|"]
        lines += [f"| {h.id} | {h.metric} | {_sides(h)} |" for h in plan.hypotheses]
    return "\n".join(lines)

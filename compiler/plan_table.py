"""A plan as a readable table: servers, points, cache actions, request counts, estimated time."""

from __future__ import annotations

from compiler.plan import Plan


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
    return "\n".join(lines).rstrip() + "\n"

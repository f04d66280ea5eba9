"""The block planner's power plan as text (`studyc plan --db`): per hypothesis the band, the block SD and the
blocks (and GPU minutes) for 80% and 95% power, then what deciding it from the last run would take."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from report.planning.block_planner import PowerRow


def _blocks(blocks: int | None, blocks_95: int | None, gpu_s: float | None, gpu_95_s: float | None,
            stored: bool = False) -> str:
    """"blocks for 80% / 95% power: 6 / 9 (~12 / ~18 GPU min)"; "more than 100" where none does it; the
    minutes "from stored runs" where they are the stored runs' starts and points."""
    counts = " / ".join(str(b) if b else "more than 100" for b in (blocks, blocks_95))
    minutes = " / ".join(f"~{g / 60:.0f}" if g is not None else "-" for g in (gpu_s, gpu_95_s))
    return f"blocks for 80% / 95% power: {counts} ({minutes} GPU min{', from stored runs' if stored else ''})"


def format_power(rows: Sequence[PowerRow], version: str | None, db: Path) -> str:
    """The power plan as text lines."""
    out = [f"power plan from {db} (vLLM {version or 'unknown'}; spreads relative, per block; power at the "
           f"stopping rule's error rate, the block SD at its 80% upper confidence bound; GPU minutes from the "
           f"plan's estimates, or, where marked, from the stored runs' starts and points, as below):"]
    for r in rows:
        tol = f"±{100 * r.tolerance:.3g}%" if r.tolerance is not None else "-"
        sd = f"{100 * r.block_sd:.2g}%" if r.block_sd is not None else "unknown"
        sd += f" (df {r.block_df:.3g})" if r.block_sd is not None and r.block_df else ""
        need = (_blocks(r.blocks, r.blocks_95, r.gpu_s, r.gpu_95_s, r.stored_costs) if r.blocks or r.blocks_95
                else "blocks: cannot say")
        launch = (f", launch-to-launch {100 * r.launch_sd:.2g}% (df {r.launch_df})" if r.launch_sd is not None
                  else "")
        out.append(f"  {r.hypothesis}: {r.metric} band {tol}, block SD {sd}{launch}: {need} ({r.source})")
        if r.last is not None:
            then = _blocks(r.last.blocks, r.last.blocks_95, r.last.gpu_s, r.last.gpu_95_s, r.stored_costs)
            under = ""
            if r.last.budget:
                under = (f"; under this study's budget of {r.last.budget} blocks, 80% power by block "
                         f"{r.last.within}" if r.last.within
                         else f"; not with 80% power within this study's budget of {r.last.budget} blocks")
            out.append(f"    from the last run's {r.last.measured:.4g} ({100 * r.last.distance:.2g}% from the edge "
                       f"{r.last.edge:.4g}), to decide it: {then}{under}")
        out += [f"    warning: {w}" for w in r.warnings]
    return "\n".join(out) + "\n"

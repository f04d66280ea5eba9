"""Decidability as the command line shows it (report.planning.decidability): the plan's section, and the lines
`studyc validate` warns with and `studyc run` refuses with, each naming the study file, line and hypothesis."""

from __future__ import annotations

import math
from collections.abc import Sequence

from compiler.load import LoadedStudy
from report.planning.decidability import NO, ONE_LAUNCH, REFUSE_BELOW, YES, Decidability, percent


def power(p: float) -> str:
    """A power as shown, cut (not rounded) to a tenth of a percent: never more than it is, so 49.96% reads
    49.9%, not 50%."""
    return f"{math.floor(1000 * p) / 10:g}%"


def _why(d: Decidability) -> str:
    """Why a hypothesis is not simply decidable, in words."""
    if d.detectable is None:
        return ONE_LAUNCH
    if d.band is None:
        return "a relation: decided once the truth is that far past its threshold"
    assert d.narrowest is not None
    return (f"its band ±{percent(d.band)} is narrower than the narrowest it could confirm, ±{percent(d.narrowest)}: "
            f"only a truth that far outside it is decided (refuted)")


def row_text(d: Decidability) -> str:
    """One hypothesis: decidable, the distance it detects, the narrowest band, the best-case power."""
    if d.detectable is None:
        return f"  {d.hypothesis}: decidable: {NO} ({ONE_LAUNCH})"
    assert d.narrowest is not None
    band = f"band ±{percent(d.band)}" if d.band is not None else "a relation"
    head = (f"  {d.hypothesis}: decidable: {d.decidable}; {band}; at {d.blocks} blocks, block SD {percent(d.block_sd)} "
            f"({d.source}): detects {percent(d.detectable)} from an edge, confirms a band of ±{percent(d.narrowest)} "
            f"or wider, best-case power {power(d.best_power)}; an inconclusive verdict would be "
            f"{d.inconclusive_kind}")
    if d.decidable != YES:
        head += f"\n    {_why(d)}"
    if d.refused:
        head += f"\n    studyc run refuses it (best-case power under {100 * REFUSE_BELOW:.0f}%) without --underpowered"
    return head


def section(rows: Sequence[Decidability]) -> str:
    """The plan's decidability section (80% power, the interval the run reads at its end)."""
    head = ("decidability (80% power at the interval the run reads at its end, at the most blocks the design allows; "
            "block SD at its 80% upper confidence bound; docs/decidability.md):")
    return "\n".join([head, *(row_text(d) for d in rows)]) + "\n"


def _where(loaded: LoadedStudy, hypothesis: str) -> str:
    index = next(i for i, h in enumerate(loaded.study.hypothesis) if h.id == hypothesis)
    key = f"hypothesis[{index}].predict"
    return f"{loaded.path}:{loaded.line(key)}: {key}"


def warnings(loaded: LoadedStudy, rows: Sequence[Decidability]) -> list[str]:
    """`studyc validate`'s warnings: each hypothesis `studyc run` would refuse; one line for a design of one
    launch per arm, which decides none."""
    out = []
    if rows and all(d.one_launch for d in rows):
        out.append(f"{loaded.path}:{loaded.line('load.launches')}: load.launches: warning: {ONE_LAUNCH}: no "
                   f"hypothesis can be decided; give 2 or more, or a [design] budget")
    for d in rows:
        if d.refused:
            out.append(f"{_where(loaded, d.hypothesis)}: warning: hypothesis {d.hypothesis} is not decidable: "
                       f"best-case power {power(d.best_power)} ({_why(d)}); studyc run refuses it without "
                       f"--underpowered")
    return out


def refusals(loaded: LoadedStudy, rows: Sequence[Decidability]) -> list[str]:
    """`studyc run`'s refusals: one line per hypothesis whose best-case power is under 50%."""
    return [f"{_where(loaded, d.hypothesis)}: hypothesis {d.hypothesis}: best-case power "
            f"{power(d.best_power)} is under {100 * REFUSE_BELOW:.0f}% ({_why(d)}, block SD "
            f"{percent(d.block_sd)} from {d.source}); widen the band, add blocks, or pass --underpowered"
            for d in rows if d.refused]

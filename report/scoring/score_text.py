"""A score's numbers as text, through the one formatter (base.format): its prediction, its measured
mean with interval and spread, its distance from the band. Shared by the site, the seed note and
`studyc audit`. Pure.
"""

from __future__ import annotations

from base import format as fmt
from report.scoring.score_model import Score


def ratio_sides(targets: tuple[str, ...]) -> str:
    """"fp8 ÷ bf16" from the targets "fp8/decode/1", "bf16/decode/1": only the parts that differ."""
    if len(targets) != 2:
        return ""
    top, bottom = (t.split("/") for t in targets)
    if len(top) != len(bottom):
        return f"{targets[0]} ÷ {targets[1]}"
    keep = [i for i, (a, b) in enumerate(zip(top, bottom, strict=True)) if a != b] or list(range(len(top)))
    return f"{'/'.join(top[i] for i in keep)} ÷ {'/'.join(bottom[i] for i in keep)}"


def prediction(score: Score, *, spec: bool = False, sides: bool = True) -> str:
    """The prediction in display units: "220.7 tok/s ± 6%", "in 1.04x–1.06x", "< 1,714 tok/s",
    "fp8 ÷ bf16: 1x ± 2%"; with `spec`, as resolved against the spec sheet."""
    predicted = score.predicted_spec if spec else score.predicted
    if predicted is None:
        return "(not evaluated)"
    low, high = (score.band_low_spec, score.band_high_spec) if spec else (score.band_low, score.band_high)
    return fmt.prediction(score.kind, unit=score.display_unit, relation=score.relation, value=predicted,
                          low=low, high=high, tolerance=score.tolerance,
                          sides=ratio_sides(score.targets) if score.ratio and sides else "")


def mean(score: Score) -> str:
    """The measured mean alone: "189.3 tok/s", "0.978x"."""
    return fmt.quantity(score.measured, score.display_unit)


def interval(score: Score) -> str:
    """The interval of the mean (at the level `read_at` says), as precise as the mean: "187.5–191.0 tok/s";
    "-" for one value."""
    if score.measured is None or score.n < 2:
        return "-"
    return fmt.span(score.ci_low, score.ci_high, score.display_unit, ref=score.measured)


def read_at(score: Score) -> str:
    """The level its interval was read at: "95% interval", "99.9% interval, look 10 of 12"; "-" for none."""
    return "-" if score.measured is None or score.n < 2 else score.interval_label


def labelled(score: Score) -> str:
    """The interval with its level: "95% interval 187.5–191.0 tok/s", "99.9% interval 0.969–0.979x, look 10
    of 12"; a capacity widened to its search's levels: "resolution bound 1.43–2.09x"."""
    return f"{score.interval_kind} {interval(score)}{score.look_text}"


def spread(score: Score) -> str:
    """Min-max over repeats: "186.9–191.2 tok/s"; "-" for one value."""
    if score.measured is None or score.n < 2:
        return "-"
    return fmt.span(score.spread_low, score.spread_high, score.display_unit, ref=score.measured)


def off_band(score: Score, *, spec: bool = False) -> str:
    """Distance of the mean from the band: "inside", "+5.3%", "-57.7%"; "-" when not measured."""
    value = score.off_band_spec if spec else score.off_band
    if score.measured is None or value is None:
        return "-"
    if value == 0:
        return "inside"
    decimals = 1  # a mean just off the band is shown off it: "+0.04%", never "0.0%"
    while decimals < 4 and round(100 * value, decimals) == 0:
        decimals += 1
    return fmt.percent(value, decimals, signed=True)


def measured(score: Score, *, spread: bool = False, n: bool = False) -> str:
    """The measured mean with its interval at the level it was read at, and when asked the min-max spread over
    repeats and n: "189.3 tok/s (95% interval 187.5–191.0 tok/s)"; one value has no interval and says so."""
    if score.measured is None:
        return "not measured"
    unit = score.display_unit
    if score.n < 2:
        parts = ["a single value"]
    else:
        parts = [labelled(score)]
        if spread:
            parts.append(f"spread {fmt.span(score.spread_low, score.spread_high, unit, ref=score.measured)}")
    if n:
        parts.append(f"n = {score.n}")
    return f"{mean(score)} ({'; '.join(parts)})"


def set_aside(score: Score) -> str:
    """The published verdict beside the one the stopping rule saw during the run, for a hypothesis resting on a
    block set aside after the run ("" for none): "block 11 set aside after the run: published, without it:
    inconclusive, 99.89% interval 0.992–1.041x, look 10 of 12; as the stopping rule saw it during the run,
    with it: refuted, 99.89% interval 0.995–1.038x, look 11 of 12"."""
    aside = score.set_aside
    if aside is None:
        return ""
    blocks = ", ".join(str(b) for b in aside.blocks)
    during = (fmt.span(aside.ci_low, aside.ci_high, score.display_unit, ref=aside.measured)
              if aside.n >= 2 and aside.measured is not None else "-")
    look = f", look {aside.look[0]} of {aside.look[1]}" if aside.look else ""
    return (f"block {blocks} set aside after the run: published, without it: {score.verdict_label}, "
            f"{labelled(score)}; as the stopping rule saw it during the run, with it: {aside.verdict}, "
            f"{fmt.percent_level(aside.confidence)} interval {during}{look}")

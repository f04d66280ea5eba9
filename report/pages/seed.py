"""The "Against the seed" note of a study page: for every hypothesis quoting its seed study (`source`),
one sentence of what the seed said, what this run measured on its GPU and whether it held, and one
summary sentence for the study. Pure: the study context (report.scoring.context: run, plan, model shapes,
hardware) and scores in, sentences out.

A batch-1 output-throughput hypothesis also gets the measured fraction of the weight-streaming ceiling,
`roofline.decode_tokens_per_s(batch=1, context=input_len + output_len/2)`, at the run's calibrated
bandwidth and at the spec sheet's: the seed states its own result that way (e.g. "81.1 % of the
bandwidth ceiling (H100)").
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from base import format as fmt
from compiler.hardware import Hardware
from compiler.predict_env import build_env
from compiler.study import Hypothesis
from report.scoring import score_text
from report.scoring.context import StudyContext
from report.scoring.score_model import Score, Why
from report.stats.verdict import Verdict
from runner.store.records import RunRecord

# What a verdict means for the seed's claim, in plain words.
HELD: dict[str, str] = {
    "confirmed": "held",
    "refuted": "did not hold",
    "inconclusive": "could not tell (inconclusive)",
    "inconclusive (one launch)": "could not tell (inconclusive: one launch per arm)",
    "invalid": "not trustworthy (invalid)",
    "not measurable here": "not measurable here (a premise it requires did not hold)",
    "not run": "not run",
}


@dataclass(frozen=True)
class Fraction:
    """Measured tok/s over one card's batch-1 roofline."""

    ceiling: str  # "calibrated" | "spec-sheet"
    card: str  # the hardware entry, e.g. "h200"
    bandwidth_Bps: float
    roofline_tok_s: float
    fraction: float
    ci_low: float | None
    ci_high: float | None
    level: str = "95% interval"  # the level its interval was read at (Score.interval_label)

    @property
    def text(self) -> str:
        ci = ""
        if self.ci_low is not None and self.ci_high is not None and self.ci_low != self.ci_high:
            ci = f" ({self.level}: {fmt.span(self.ci_low, self.ci_high, '%')})"
        bandwidth = f"{self.bandwidth_Bps / 1e9:,.0f} GB/s"
        at = f"the measured {bandwidth}" if self.ceiling == "calibrated" else f"the {self.card} sheet's {bandwidth}"
        roof = fmt.quantity(self.roofline_tok_s, "tok/s")
        return f"{fmt.quantity(self.fraction, '%')}{ci} of the {self.ceiling} ceiling ({roof} at {at})"


@dataclass(frozen=True)
class SeedLine:
    """One hypothesis against its seed: the parts (for the page) and the whole sentence (`text`)."""

    hypothesis: str
    anchor: str
    claim: str
    seed: str  # the seed's own figure or words, quoted
    gpu: str  # "NVIDIA H200", "CPU", "" (no run)
    measured: str  # "189.3 tok/s (95% interval 187.5–191.0 tok/s; spread 188.6–190.0 tok/s; n = 3)"
    fractions: tuple[Fraction, ...]
    prediction: str  # our prediction of it, in display units
    verdict: Verdict
    held: str  # HELD[its verdict label]
    reason: str  # why invalid / not run, when it is

    @property
    def fraction_text(self) -> str:
        return " and ".join(f.text for f in self.fractions)

    # The sentence in three parts, so a page can mark the verdict up: said, got, "judged: held (reason)."
    @property
    def said(self) -> str:
        return f"the seed said “{self.seed}”."

    @property
    def got(self) -> str:
        if not self.measured:
            return "Not measured."
        got = f"On the {self.gpu}: {self.measured}"
        if self.fractions:
            got += f", {self.fraction_text}"
        return got + "."

    @property
    def judged(self) -> str:
        return f"Against our prediction ({self.prediction}):"

    @property
    def because(self) -> str:
        return f" ({self.reason})" if self.reason else ""

    @property
    def text(self) -> str:
        """The whole line: `hypothesis: said got judged held (reason).`"""
        return f"{self.hypothesis}: {self.said} {self.got} {self.judged} {self.held}{self.because}."


@dataclass(frozen=True)
class SeedNote:
    gpu: str
    summary: str
    lines: tuple[SeedLine, ...]


def gpu_name(run: RunRecord | None) -> str:
    """The accelerator a run measured on, as its provenance names it; "" without a run."""
    if not run:
        return ""
    return str(run.gpu_name or "CPU (no GPU)")


def seed_note(ctx: StudyContext, scores: Sequence[Score]) -> SeedNote | None:
    """The note for one study scored against its run (None: not run); None when no hypothesis has a source."""
    by_id = {h.id: h for h in ctx.study.hypothesis}
    gpu = gpu_name(ctx.run)
    lines = tuple(_line(ctx, by_id[s.hypothesis], s, gpu) for s in scores
                  if s.hypothesis in by_id and by_id[s.hypothesis].source.strip())
    if not lines:
        return None
    return SeedNote(gpu=gpu, summary=summary([line.verdict for line in lines], gpu), lines=lines)


def summary(verdicts: Sequence[str], gpu: str) -> str:
    """"2 of 5 seed claims held on the NVIDIA H200; for 3 we could not tell (inconclusive)."."""
    total = len(verdicts)
    claims = f"seed claim{'s' if total != 1 else ''}"
    if not gpu:
        return f"No run yet: none of the {total} {claims} has been measured."
    count = {v: sum(1 for x in verdicts if x == v) for v in HELD}

    def were(n: int) -> str:
        return "was" if n == 1 else "were"

    rest = []
    if count["refuted"]:
        rest.append(f"{count['refuted']} did not hold")
    if count["inconclusive"]:
        rest.append(f"for {count['inconclusive']} we could not tell (inconclusive)")
    if count["invalid"]:
        rest.append(f"{count['invalid']} {were(count['invalid'])} not trustworthy (invalid: a point failed a check)")
    if count["not run"]:
        rest.append(f"{count['not run']} {were(count['not run'])} not run")
    head = f"{count['confirmed']} of {total} {claims} held on the {gpu}"
    return "; ".join([head, *rest]) + "."


def _line(ctx: StudyContext, hyp: Hypothesis, s: Score, gpu: str) -> SeedLine:
    measured = "" if s.measured is None else score_text.measured(s, spread=True, n=True)
    return SeedLine(
        hypothesis=s.hypothesis, anchor=f"h-{s.hypothesis}", claim=s.claim, seed=hyp.source.strip(), gpu=gpu,
        measured=measured, fractions=roofline_fractions(ctx, hyp, s), prediction=score_text.prediction(s),
        verdict=s.verdict, held=HELD[s.verdict_label], reason=_reason(s, ctx.run),
    )


def _reason(s: Score, run: RunRecord | None) -> str:
    if s.verdict == "invalid":
        bad = [r for r in s.reasons if r.invalidates]
        failed = sorted({c for r in bad if r.why is Why.FAILED_CHECK for c in r.checks})
        what = f"the {', '.join(failed)} check" if failed else "a check or did not finish"
        if not bad and s.has(Why.PREDICTION):
            return "its prediction could not be evaluated"
        return f"{len(bad)} of its points failed {what}" if bad else "a point it rests on failed a check"
    if s.verdict == "not run":
        if run is None:
            return "no run in the results database(s)"
        return "the run has no point for it" if s.has(Why.NO_POINTS) else "not measured in this run"
    return ""


def roofline_fractions(ctx: StudyContext, hyp: Hypothesis, s: Score) -> tuple[Fraction, ...]:
    """Measured batch-1 tok/s / the model library's roofline, calibrated then spec sheet; () where the
    hypothesis is not a plain output_throughput at concurrency 1, or nothing was measured."""
    study = ctx.study
    if hyp.metric != "output_throughput" or hyp.predict.ratio is not None or s.measured is None:
        return ()
    step = ctx.hypotheses.get(hyp.id)
    if step is None:
        return ()
    target = step.numerator
    if target.concurrency != 1 or target.workload is None or target.workload not in study.workloads:
        return ()
    model = ctx.model(target.arm)
    cal, spec, calibrated = ctx.calibrated_hw, ctx.spec_hw, ctx.calibrated
    if model.shape is None or spec is None or cal is None:
        return ()
    shape, dtype, kv = model.shape, model.dtype, model.kv_dtype
    means = study.workloads[target.workload].mean_lengths
    if means is None:  # a replayed trace: its lengths are in its file, not the study
        return ()
    context = means[0] + means[1] / 2

    def fraction(label: str, hw: Hardware) -> Fraction | None:
        roof = build_env(shape, hw, dtype=dtype, kv_dtype=kv)["roofline.decode_tokens_per_s"]
        assert callable(roof)
        tok_s = float(roof(1, context))
        if not (tok_s > 0 and math.isfinite(tok_s)):
            return None
        assert s.measured is not None
        return Fraction(label, spec.name, hw.bandwidth_Bps, tok_s, s.measured / tok_s,
                        None if s.ci_low is None else s.ci_low / tok_s,
                        None if s.ci_high is None else s.ci_high / tok_s, s.interval_label)

    cards = ([("calibrated", cal)] if calibrated else []) + [("spec-sheet", spec)]
    return tuple(f for label, hw in cards if (f := fraction(label, hw)) is not None)

"""'Against the seed': the note's sentences from scores + run provenance, the batch-1 roofline fraction,
the note on the study page, and `studyc audit --markdown`."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from compiler.hardware import get_hardware
from compiler.load import load_study
from compiler.modelconfig import load_model
from report.audit import md_cell
from report.pages.seed import HELD, SeedNote, seed_note, summary
from report.pages.site import build_site
from report.results import latest_runs
from report.scoring.context import build_context, serving_dtypes
from report.scoring.score_model import label_of
from report.scoring.scoring import score as score_context
from report.scoring.scoring import score_study
from report.stats.verdict import VERDICTS
from studyc.cli import main
from tests.report.helpers import TINY_MODEL, P, make_db, write_study
from tests.report.test_scoring import _points

# One hypothesis per verdict, each quoting a made-up seed; `quiet` quotes nothing and gets no line.
SOURCED = '''
[[hypothesis]]
id = "tight"
claim = "c1 throughput is 100 tok/s"
metric = "output_throughput"
where = { arm = "a", concurrency = 1 }
predict = { value = 100.0, tolerance = 0.05 }
source = "100 tok/s at batch 1 (seed GPU)"

[[hypothesis]]
id = "far"
claim = "c4 throughput is 1000 tok/s"
metric = "output_throughput"
where = { arm = "a", concurrency = 4 }
predict = { value = 1000.0, tolerance = 0.05 }
source = "1,000 tok/s at concurrency 4"

[[hypothesis]]
id = "noisy"
claim = "b at c1 is 100 tok/s"
metric = "output_throughput"
where = { arm = "b", concurrency = 1 }
predict = { value = 100.0, tolerance = 0.05 }
source = "b matches a"

[[hypothesis]]
id = "broken"
claim = "ttft at b/c4 under 1 s"
metric = "ttft_p50_s"
where = { arm = "b", concurrency = 4 }
predict = { relation = "<", value = 1.0 }
source = "TTFT | under a second <b>always</b>"

[[hypothesis]]
id = "power"
claim = "power is measured"
metric = "power_mean_w"
where = { arm = "a", concurrency = 1 }
predict = { relation = ">", value = 1.0 }
source = "300 W at batch 1"

[[hypothesis]]
id = "quiet"
claim = "c4 gives more than twice c1"
metric = "output_throughput"
where = { arm = "a" }
predict = { ratio = [{ concurrency = 4 }, { concurrency = 1 }], relation = ">", value = 2.0 }
'''

H200 = {"gpu_name": "NVIDIA H200"}


def _note(tmp: Path, run_extra: dict[str, Any] | None = None) -> SeedNote:
    loaded = load_study(write_study(tmp, SOURCED))
    data = latest_runs([make_db(tmp / "r.duckdb", _points())])["toy"]
    ctx = build_context(loaded, dataclasses.replace(data, run=dataclasses.replace(data.run, **(run_extra or {}))))
    note = seed_note(ctx, score_context(ctx))
    assert note is not None
    return note


def test_each_verdict_in_plain_words(tmp_path: Path) -> None:
    note = _note(tmp_path, H200)
    by_id = {line.hypothesis: line for line in note.lines}
    assert list(by_id) == ["tight", "far", "noisy", "broken", "power"]  # file order; `quiet` has no source
    assert {h: line.verdict for h, line in by_id.items()} == {
        "tight": "inconclusive", "far": "inconclusive", "noisy": "inconclusive", "broken": "invalid",
        "power": "not run"}  # every arm ran on one launch: nothing is confirmed or refuted
    one = "could not tell (inconclusive: one launch per arm)"
    want = {"tight": one, "far": one, "noisy": one, "broken": "not trustworthy (invalid)", "power": "not run"}
    assert {h: line.held for h, line in by_id.items()} == want
    assert set(HELD) >= {label_of(v, one, refuted) for v in VERDICTS for one in (False, True)
                          for refuted in (False, True)}  # every label a score can show
    assert HELD == {"confirmed": "held", "refuted": "did not hold", "inconclusive": "could not tell (inconclusive)",
                    "inconclusive (one launch)": one,
                    "invalid": "not trustworthy (invalid)",
                    "not measurable here": "not measurable here (a premise it requires did not hold)",
                    "not run": "not run"}

    tight = by_id["tight"].text
    assert tight.startswith("tight: the seed said “100 tok/s at batch 1 (seed GPU)”. On the NVIDIA H200: ")
    assert "100.0 tok/s (95% interval 97.5–102.5 tok/s; spread 99.0–101.0 tok/s; n = 3)" in tight
    assert tight.endswith(f"Against our prediction (100 tok/s ± 5%): {one}.")
    assert by_id["far"].text.endswith(f"Against our prediction (1,000 tok/s ± 5%): {one}.")
    assert "(95% interval 70.2–129.8 tok/s; spread 88.0–112.0 tok/s; n = 3)" in by_id["noisy"].text
    broken = by_id["broken"]
    assert "200.0 ms" in broken.got and broken.prediction == "< 1,000 ms"
    assert broken.reason == "1 of its points failed the littles_law check"
    assert broken.text.endswith(": not trustworthy (invalid) (1 of its points failed the littles_law check).")
    power = by_id["power"]
    assert power.got == "Not measured." and power.reason == "not measured in this run"
    assert power.text.endswith("Against our prediction (> 1 W): not run (not measured in this run).")

    assert note.gpu == "NVIDIA H200"
    assert note.summary == ("0 of 5 seed claims held on the NVIDIA H200; for 3 we could not tell (inconclusive); 1 was "
                            "not trustworthy (invalid: a point failed a check); 1 was not run.")


def test_summary_wording() -> None:
    assert summary(["confirmed", "confirmed", "inconclusive", "inconclusive", "inconclusive"], "NVIDIA H200") == (
        "2 of 5 seed claims held on the NVIDIA H200; for 3 we could not tell (inconclusive).")
    assert summary(["refuted"], "NVIDIA H100 80GB HBM3") == "0 of 1 seed claim held on the NVIDIA H100 80GB HBM3; 1 did not hold."
    assert summary(["not run", "not run"], "") == "No run yet: none of the 2 seed claims has been measured."


def test_gpu_name_comes_from_the_run_and_no_run_is_said(tmp_path: Path) -> None:
    assert _note(tmp_path).gpu == "CPU (no GPU)"  # the run recorded no GPU
    loaded = load_study(write_study(tmp_path, SOURCED))
    note = seed_note(build_context(loaded, None), score_study(loaded, None))
    assert note is not None and note.summary == "No run yet: none of the 5 seed claims has been measured."
    assert all(line.held == "not run" and line.reason == "no run in the results database(s)" for line in note.lines)
    plain = load_study(write_study(tmp_path, SOURCED.replace("source = ", "# source = "), study_id="plain"))
    assert seed_note(build_context(plain, None), score_study(plain, None)) is None  # nothing quoted: no note


FRACTION = '''
[[hypothesis]]
id = "roof"
claim = "batch-1 decode at half the roofline"
metric = "output_throughput"
where = { arm = "a", concurrency = 1 }
predict = { value = "0.5 * roofline.decode_tokens_per_s(batch=1, context=144)", tolerance = 0.5 }
source = "81.1 % of the bandwidth ceiling (H100)"

[[hypothesis]]
id = "c4"
claim = "c4 throughput"
metric = "output_throughput"
where = { arm = "a", concurrency = 4 }
predict = { value = 400.0 }
source = "not at batch 1"

[[hypothesis]]
id = "ratio"
claim = "a ratio at c1"
metric = "output_throughput"
where = { concurrency = 1 }
predict = { ratio = ["b", "a"], value = 1.0 }
source = "a ratio"
'''


@pytest.mark.parametrize("calibrated", [True, False])
def test_fraction_of_the_batch1_roofline(tmp_path: Path, calibrated: bool) -> None:
    loaded = load_study(write_study(tmp_path, FRACTION))
    values = [90.0, 100.0, 110.0]
    points = [P(arm, lv, r, {"output_throughput": values[r] * (lv if arm == "a" else 1)})
              for arm in ("a", "b") for lv in (1, 4) for r in range(3)]
    bandwidth, flops = 10e9, 0.5e12
    db = make_db(tmp_path / "r.duckdb", points, calibrated=calibrated,
                 bandwidth_Bps=bandwidth if calibrated else None, flops_bf16=flops if calibrated else None)
    data = latest_runs([db])["toy"]
    ctx = build_context(loaded, data)
    scores = score_context(ctx)
    note = seed_note(ctx, scores)
    assert note is not None
    by_id = {line.hypothesis: line for line in note.lines}
    assert by_id["c4"].fractions == () and by_id["ratio"].fractions == ()  # not a plain batch-1 tok/s

    shape = load_model(TINY_MODEL)
    dtype, kv = serving_dtypes(loaded.study, "a", shape)
    context = 128 + 32 / 2  # the workload's input_len + output_len / 2
    spec = get_hardware("cpu")

    def roof(bw: float, fl: float) -> float:
        return shape.decode_tokens_per_s(1, context, bw, dtype, kv, fl)

    fractions = by_id["roof"].fractions
    cards = [("calibrated", bandwidth, roof(bandwidth, flops))] if calibrated else []
    cards.append(("spec-sheet", spec.bandwidth_Bps, roof(spec.bandwidth_Bps, spec.flops_bf16)))
    assert [(f.ceiling, f.bandwidth_Bps) for f in fractions] == [(c, bw) for c, bw, _ in cards]
    for f, (_, _, tok_s) in zip(fractions, cards, strict=True):
        assert f.roofline_tok_s == pytest.approx(tok_s)
        assert f.fraction == pytest.approx(100.0 / tok_s)  # the measured mean over the ceiling
        score = next(s for s in scores if s.hypothesis == "roof")
        assert (f.ci_low, f.ci_high) == pytest.approx((score.ci_low / tok_s, score.ci_high / tok_s))
        assert f"{100 * f.fraction:.1f}% (95% interval: " in by_id["roof"].text
    # the prediction resolves the same roofline: the fraction is 0.5 x measured / predicted
    score = next(s for s in scores if s.hypothesis == "roof")
    assert fractions[0].fraction == pytest.approx(0.5 * score.measured / score.predicted)
    text = by_id["roof"].text
    assert "of the spec-sheet ceiling" in text and "the cpu sheet's 20 GB/s" in text
    assert ("of the calibrated ceiling" in text and "the measured 10 GB/s" in text) == calibrated


def test_study_page_shows_the_note_escaped(tmp_path: Path) -> None:
    study = write_study(tmp_path, SOURCED)
    db = make_db(tmp_path / "r.duckdb", _points())
    build_site([db], tmp_path / "site", study_paths=[study])
    page = (tmp_path / "site/studies/toy/index.html").read_text(encoding="utf-8")
    assert '<h2 id="seed">Against the seed</h2>' in page
    assert "0 of 5 seed claims held on the CPU (no GPU)" in page
    assert '<span class="verdict v-inconclusive">could not tell (inconclusive: one launch per arm)</span>' in page
    assert ('<span class="verdict v-inconclusive">inconclusive</span><br><span class="note">(one launch)</span>'
            in page)  # the table's cell
    assert "<b>always</b>" not in page and "&lt;b&gt;always&lt;/b&gt;" in page  # autoescaped
    assert page.index('id="seed"') < page.index('id="hypotheses"')
    plain = write_study(tmp_path, SOURCED.replace("source = ", "# source = "), study_id="plain")
    build_site([make_db(tmp_path / "p.duckdb", _points(), study_id="plain")], tmp_path / "s2", study_paths=[plain])
    assert "Against the seed" not in (tmp_path / "s2/studies/plain/index.html").read_text(encoding="utf-8")


def test_audit_markdown_prints_a_row_per_hypothesis(tmp_path: Path) -> None:
    study = write_study(tmp_path, SOURCED)
    db = make_db(tmp_path / "r.duckdb", _points())
    runner = CliRunner()
    result = runner.invoke(main, ["audit", str(study), "--db", str(db), "--markdown"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == "| study | claim | seed said | our prediction | measured | n | verdict |"
    assert lines[1] == "|---|---|---|---|---:|---:|---|"
    rows = [line for line in lines[2:] if line.startswith("| ")]
    assert len(rows) == 6 and all(r.startswith("| toy | ") and r.endswith(" |") for r in rows)
    cells = {r.split(" | ")[1]: r for r in rows}
    assert cells["c1 throughput is 100 tok/s"] == (
        "| toy | c1 throughput is 100 tok/s | 100 tok/s at batch 1 (seed GPU) | 100 tok/s ± 5% | "
        "100.0 tok/s (95% interval 97.5–102.5 tok/s) | 3 | inconclusive (one launch) |")
    broken = cells["ttft at b/c4 under 1 s"]
    assert "TTFT \\| under a second &lt;b>always&lt;/b>" in broken and "< 1,000 ms" in broken
    assert broken.endswith("| 3 | invalid |")
    assert cells["power is measured"].endswith("| > 1 W | not measured | 0 | not run |")
    assert "| a/w/4 ÷ a/w/1: > 2x | 4.000x (95% interval" not in cells["c4 gives more than twice c1"]
    assert ("| 4 ÷ 1: > 2x | 3.999x (95% interval 3.853–4.151x) | 3 | inconclusive (one launch) |"
            in cells["c4 gives more than twice c1"])
    assert "| - |" in cells["c4 gives more than twice c1"]  # no source quoted
    # The fixture's run stores no plan ("{}") and another file hash: the audit cannot say the plan still stands.
    assert ("`toy` run run-1 (CPU (no GPU), vLLM 0.0-test; 1 launch per arm x 3 repeats; the study file changed "
            "since: its stored plan is unreadable)") in result.output

    both = runner.invoke(main, ["audit", str(study), "--db", str(db), "--markdown", "--json"])
    assert both.exit_code == 2 and "at most one of --json and --markdown" in both.output


def test_md_cell() -> None:
    assert md_cell("a | b\n c") == "a \\| b c"
    assert md_cell("") == "-"
    assert md_cell("<script>x</script> < 0.5") == "&lt;script>x&lt;/script> < 0.5"

"""The command line: output formats, warnings, and the preflight that runs before any measuring."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from base.errors import EngineError, StudycError
from runner.server.engine_check import check_engine
from runner.server.preflight import check_hardware, hardware_mismatch
from studyc.cli import main

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "studies/quickstart.toml"


def _variant(tmp_path: Path, old: str, new: str) -> Path:
    text = QUICKSTART.read_text().replace('path = "../models/tiny-qwen3"', f'path = "{ROOT / "models/tiny-qwen3"}"')
    assert old in text
    path = tmp_path / "variant.toml"
    path.write_text(text.replace(old, new, 1))
    return path


@pytest.mark.parametrize("args", [["--json"], ["--format", "json"]])
def test_plan_json_flag_and_format_agree(args: list[str]) -> None:
    result = CliRunner().invoke(main, ["plan", str(QUICKSTART), *args])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["study_id"] == "quickstart"


def test_plan_bench_gives_each_point_the_same_load_from_vllm_bench_serve() -> None:
    result = CliRunner().invoke(main, ["plan", str(QUICKSTART), "--bench", "--format", "json"])
    assert result.exit_code == 0, result.output
    points = [p for launch in json.loads(result.output)["launches"] for p in launch["points"]]
    c4 = next(p for p in points if p["concurrency"] == 4)
    command = c4["bench_equivalent"]
    for part in ("bench serve", "--temperature 0", "--ignore-eos", "--max-concurrency 4",
                 f"--num-prompts {c4['requests']}", f"--random-output-len {c4['output_len']}"):
        assert part in command, part
    assert all("bench_equivalent" in p for p in points)
    table = CliRunner().invoke(main, ["plan", str(QUICKSTART), "--bench"])
    assert table.exit_code == 0 and "what differs:" in table.output and c4["id"] + ":" in table.output
    plain = CliRunner().invoke(main, ["plan", str(QUICKSTART), "--format", "json"])
    assert "bench_equivalent" not in plain.output


def test_plan_markdown_and_table() -> None:
    markdown = CliRunner().invoke(main, ["plan", str(QUICKSTART), "--format", "markdown"])
    assert markdown.exit_code == 0 and "| quickstart/cold/L1 | quickstart/cold/L1/short/c1/r1 | reset |" in markdown.stdout
    assert ("| batching-helps | output_throughput | ratio of 3 point(s) on 3 launches over 3 point(s) on 3 launches |") in markdown.stdout
    table = CliRunner().invoke(main, ["plan", str(QUICKSTART), "--format", "table"])
    assert "hypothesis kept-cache-hits: prefix_hit_rate on 3 point(s) on 3 launches" in table.stdout


def test_two_formats_at_once_is_a_usage_error() -> None:
    result = CliRunner().invoke(main, ["plan", str(QUICKSTART), "--json", "--format", "markdown"])
    assert result.exit_code == 2 and "give at most one of --json and --markdown" in result.output


@pytest.mark.parametrize(("args", "starts"), [
    (["--format", "json"], "{"), (["--json"], "{"), (["--format", "markdown"], "| quantity | value |"),
    (["--markdown"], "| quantity | value |"), ([], "name"),
])
def test_model_formats(args: list[str], starts: str) -> None:
    result = CliRunner().invoke(main, ["model", str(ROOT / "models/qwen3-8b"), *args])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(starts)


def test_audit_accepts_format_and_old_flags(tmp_path: Path) -> None:
    from runner.store.store import Store

    db = tmp_path / "empty.duckdb"  # no run: every hypothesis is "not run"
    with Store(db):
        pass
    for args in (["--format", "json"], ["--json"]):
        result = CliRunner().invoke(main, ["audit", str(QUICKSTART), "--db", str(db), *args])
        assert result.exit_code == 0, result.output
        rows = json.loads(result.stdout)
        assert {row["verdict"] for row in rows} == {"not run"}
    markdown = CliRunner().invoke(main, ["audit", str(QUICKSTART), "--db", str(db), "--format", "markdown"])
    assert markdown.exit_code == 0 and markdown.stdout.startswith("| study |")
    both = CliRunner().invoke(main, ["audit", str(QUICKSTART), "--json", "--markdown"])
    assert both.exit_code == 2


def test_hardware_mismatch_rules() -> None:
    assert hardware_mismatch("cpu", None) is None
    assert hardware_mismatch("h200", "NVIDIA H200") is None
    assert hardware_mismatch("h100", "NVIDIA H100 80GB HBM3") is None
    no_gpu = hardware_mismatch("b200", None)
    assert no_gpu is not None and "no GPU" in no_gpu and "b200 spec sheet" in no_gpu
    other = hardware_mismatch("h200", "NVIDIA H100 80GB HBM3")
    assert other is not None and "h100-sxm" in other
    assert hardware_mismatch("cpu", "NVIDIA H200") is not None
    unknown = hardware_mismatch("h200", "NVIDIA RTX 9999")
    assert unknown is not None and "not in the hardware table" in unknown


def test_check_hardware_refuses_or_warns() -> None:
    with pytest.raises(StudycError, match="--allow-hardware-mismatch") as caught:
        check_hardware([("a", "cpu"), ("s", "b200")], None)
    assert "s: the study names hardware 'b200'" in caught.value.message and "a:" not in caught.value.message
    assert check_hardware([("s", "b200")], None, allow_mismatch=True) == [f"s: {hardware_mismatch('b200', None)}"]
    assert check_hardware([("a", "cpu")], None) == []


def test_check_engine_reports_a_failing_command(tmp_path: Path) -> None:
    script = tmp_path / "vllm"
    script.write_text("#!/bin/sh\necho 'ImportError: no module named torch' >&2\nexit 3\n")
    script.chmod(0o755)
    with pytest.raises(EngineError, match="no module named torch"):
        check_engine([str(script)])
    script.write_text("#!/bin/sh\necho 0.32.0+cpu\n")
    assert check_engine([str(script)]).version == "0.32.0+cpu"
    with pytest.raises(EngineError, match="empty"):
        check_engine([])


def test_missing_engine_is_found_before_calibration_once_and_leaves_no_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STUDYC_VLLM", str(tmp_path / "no-such-vllm"))
    db = tmp_path / "results.duckdb"
    result = CliRunner().invoke(main, ["run", str(QUICKSTART), "--db", str(db)])
    assert result.exit_code == 1
    assert result.output.count("engine command not found") == 1
    assert "calibrat" not in result.output and "ceiling" not in result.output
    assert not db.exists() and not (tmp_path / "runs").exists()


def test_gpu_hardware_on_a_cpu_host_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from runner.measure.nvml import gpu_info

    if gpu_info(0) is not None:
        pytest.skip("this host has a GPU")
    monkeypatch.setenv("STUDYC_VLLM", str(tmp_path / "no-such-vllm"))
    path = _variant(tmp_path, 'hardware = "cpu"', 'hardware = "b200"')
    db = tmp_path / "results.duckdb"
    refused = CliRunner().invoke(main, ["run", str(path), "--db", str(db)])
    assert refused.exit_code == 1
    assert "this host has no GPU" in refused.output and "--allow-hardware-mismatch" in refused.output
    allowed = CliRunner().invoke(main, ["run", str(path), "--db", str(db), "--allow-hardware-mismatch"])
    assert "warning: quickstart: the study names hardware 'b200'" in allowed.stderr
    assert "engine command not found" in allowed.output  # went on to the engine check
    assert not db.exists()


ONE_WAVE = f"""
[study]
id = "one-wave"
title = "One wave at c4"
question = "Does a single wave validate with a warning?"
hardware = "cpu"

[model]
path = "{ROOT / "models/tiny-qwen3"}"

[arms.base]

[workloads.short]
input_len = 16
output_len = 8

[load]
concurrency = [4]
requests = {{requests}}
launches = 1
repeats = 1

[[hypothesis]]
id = "fast"
claim = "fast enough"
metric = "output_throughput"
predict = {{{{ relation = ">", value = 1.0 }}}}
"""


@pytest.mark.parametrize(("requests", "warned"), [(4, True), (16, False)])
def test_validate_prints_warnings_on_stderr_and_passes(tmp_path: Path, requests: int, warned: bool) -> None:
    path = tmp_path / "one_wave.toml"
    path.write_text(ONE_WAVE.format(requests=requests))
    result = CliRunner().invoke(main, ["validate", str(path)])
    assert result.exit_code == 0, result.output
    assert result.stdout == f"{path}: ok (1 hypothesis)\n"
    assert ("load.requests: warning: 4 requests at concurrency 4 is one wave" in result.stderr) is warned


def test_progress_console_does_not_wrap_when_not_a_terminal(tmp_path: Path) -> None:
    from studyc.progress import console_for

    out = tmp_path / "log.txt"
    with open(out, "w") as fh:
        console_for(fh).print("x" * 300, markup=False)
    assert out.read_text() == "x" * 300 + "\n"


def test_eta_counts_server_starts_still_ahead() -> None:
    from compiler.load import load_study
    from compiler.plan_compile import compile_study
    from studyc.progress import remaining_s

    plan = compile_study(load_study(QUICKSTART))
    points = sum(p.estimated_s for p in plan.points)
    starts = sum(s.estimated_start_s for s in plan.launches)
    assert remaining_s(plan, set(), set(), 1.0) == pytest.approx(points + starts)
    first = plan.launches[0]
    left = remaining_s(plan, {p.id for p in first.points}, {first.id}, 1.0)
    ahead = plan.launches[1:]
    assert left == pytest.approx(sum(p.estimated_s for s in ahead for p in s.points) + sum(s.estimated_start_s for s in ahead))
    assert remaining_s(plan, set(), {first.id}, 2.0) == pytest.approx(2 * (points + starts - first.estimated_start_s))


def test_plan_shows_each_prediction_through_the_one_formatter() -> None:
    table = CliRunner().invoke(main, ["plan", str(QUICKSTART)])
    assert "hypothesis batching-helps: output_throughput ratio of 3 point(s) on 3 launches over 3 point(s) on 3 " \
        "launches, predicted > 1.5x" in table.stdout
    assert "hypothesis kept-cache-hits: prefix_hit_rate on 3 point(s) on 3 launches, predicted 75% ± 20% (relative)" \
        in table.stdout
    assert "hypothesis fast-first-token: ttft_p50_s on 3 point(s) on 3 launches, predicted < 100 ms" in table.stdout
    markdown = CliRunner().invoke(main, ["plan", str(QUICKSTART), "--format", "markdown"])
    assert "| cold-means-cold | prefix_hit_rate | on 3 point(s) on 3 launches | < 1% |" in markdown.stdout


def test_eta_and_plan_durations_are_the_formatters() -> None:
    from base import format as fmt
    from studyc.progress import eta_text

    assert eta_text(3723.4) == "eta " + fmt.duration(3723.4) == "eta 1h02m03s"
    assert eta_text(65) == "eta 1m05s"


def test_an_allowed_hardware_mismatch_is_stored_in_the_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The warning --allow-hardware-mismatch lets through is in the run record's notes, not only on stderr.
    The engine answers --version and then fails to serve, so the run stops at its first server."""
    from runner.measure.nvml import gpu_info
    from runner.store.store import Store

    if gpu_info(0) is not None:
        pytest.skip("this host has a GPU")
    engine = tmp_path / "vllm"
    engine.write_text('#!/bin/sh\nif [ "$1" = "--version" ]; then echo 0.0.0+fake; exit 0; fi\n'
                      "echo 'RuntimeError: no engine here' >&2\nexit 3\n")
    engine.chmod(0o755)
    monkeypatch.setenv("STUDYC_VLLM", str(engine))
    path = _variant(tmp_path, 'hardware = "cpu"', 'hardware = "b200"')
    db = tmp_path / "results.duckdb"
    result = CliRunner().invoke(main, ["run", str(path), "--db", str(db), "--no-calibrate", "--allow-hardware-mismatch"])
    assert "warning: quickstart: the study names hardware 'b200'" in result.stderr
    with Store(db, read_only=True) as store:
        runs = store.runs()
    assert len(runs) == 1
    assert f"hardware mismatch allowed (--allow-hardware-mismatch): quickstart: {hardware_mismatch('b200', None)}" \
        in (runs[0].notes or "")


@pytest.mark.parametrize(("status", "starting", "counted"), [
    ("starting", True, True),
    ("starting (held: imported while the launch before ran)", True, True),
    ("starting (held: imported before its start); calibrated: 4.19 TB/s", True, True),
    ("starting; not calibrated: no NVML", True, True),
    ("warmup-trap/cold/L1/r1: starting (held: imported before its start)", True, True),
    ("ready in 48.6 s, warm compile cache, KV 471424 tokens", False, False),
    ("stopped", False, False),
    ("failed", False, False),
    ("warmup-trap/cold/L1/r1: ready in 4.0 s", False, False),
])
def test_every_kind_of_start_counts_as_a_start(status: str, starting: bool, counted: bool) -> None:
    """A held start and a calibrated one are starts too: missed, the ETA counted every start as still ahead
    and divided the whole run's time by the points' estimates alone (an ETA of 11h50m for a 9-minute run).
    The event says it is a start; the progress line's wording does not decide it."""
    import io

    from compiler.load import load_study
    from compiler.plan_compile import compile_study
    from studyc.progress import LiveProgress

    plan = compile_study(load_study(QUICKSTART))
    live = LiveProgress(plan, io.StringIO())
    live.server(plan.launches[0], status, starting=starting)
    assert (plan.launches[0].id in live.started) is counted


def test_pace_is_shrunk_toward_the_plan_early_and_follows_the_run_late() -> None:
    from studyc.progress import PACE_PRIOR_S, pace_of

    assert pace_of(0.0, 0.0) == 1.0
    assert pace_of(60.0, 20.0) == pytest.approx((60 + PACE_PRIOR_S) / (20 + PACE_PRIOR_S))
    assert pace_of(60.0, 20.0) < 1.5  # one short point three times its estimate does not triple the ETA
    assert pace_of(20_000.0, 10_000.0) == pytest.approx(2.0, rel=0.01)
    assert pace_of(5_000.0, 10_000.0, prior_s=0.0) == 0.5


def test_the_eta_counts_from_the_first_measured_start(monkeypatch: pytest.MonkeyPatch) -> None:
    """Calibration and priming before the first launch are not the pace: a run that spent 300 s priming
    and whose launches then ran to estimate shows the plan's remaining time, not 300 s more per point."""
    import io

    from compiler.load import load_study
    from compiler.plan_compile import compile_study
    from studyc import progress

    plan = compile_study(load_study(QUICKSTART))
    clock = [1000.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: clock[0])
    live = progress.LiveProgress(plan, io.StringIO())
    clock[0] += 300.0  # calibration, priming
    first = plan.launches[0]
    live.server(first, "starting (held: imported before its start)", starting=True)
    live.server(first, "starting (held: imported before its start)", starting=True)  # a replica's: counted once
    assert live.started == {first.id} and live.estimated_done_s == first.estimated_start_s
    clock[0] += first.estimated_start_s
    expected = progress.remaining_s(plan, set(), {first.id}, 1.0)
    assert live._eta() == progress.eta_text(expected)

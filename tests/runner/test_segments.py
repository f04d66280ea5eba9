"""Where a run's wall goes: start phases read from real server logs, a point's phases, segments and their
phases in a real DuckDB file (a killed segment closed by the next), and the commit of a copied tree."""

from __future__ import annotations

import tarfile
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from runner.execute.run import COMMIT_FILE, git_sha
from runner.execute.segments import GAP, Timeline, phase_table, point_phases
from runner.server.startlog import START_PHASES, UNSPLIT, start_phases
from runner.store.records import RunRecord
from runner.store.store import Store
from tests.conftest import REPO

# A run's server logs are published as one xz tar per run (results/h200-logs/RUN.tar.xz)
H200_LOGS = REPO / "results/h200-logs/20261203T075449-6a1a6d.tar.xz"
H200_LOG = "20261203T075449-6a1a6d/decode-roofline__qwen3-8b__L1.log"
SPAWN = datetime(2026, 12, 3, 7, 55, 0, 500_000)  # half a second before the first stamp's second


def line(at: str, text: str, proc: str = "EngineCore") -> str:
    return f"({proc} pid=1) INFO 12-03 {at} [x.py:1] {text}"


def test_a_real_gpu_start_splits_into_every_phase() -> None:
    with tarfile.open(H200_LOGS) as logs:
        member = logs.extractfile(H200_LOG)
        assert member is not None
        text = member.read().decode(errors="replace")
    got = start_phases(text, SPAWN, 143.1)
    assert [n for n, _ in got] == [n for n, _ in START_PHASES]
    assert sum(s for _, s in got) == pytest.approx(143.1)
    phases = dict(got)
    assert phases["start: imports (API process)"] == pytest.approx(23.5)  # 07:55:00.5 -> 07:55:24
    assert phases["start: torch.compile"] == 38.0  # 07:56:19 -> 07:56:57 ("torch.compile took 37.57 s")
    assert phases["start: CUDA graph capture"] == 6.0 and phases["start: post-capture"] == 15.0


def test_a_phase_the_log_does_not_show_is_unsplit() -> None:
    text = "\n".join([
        "# studyc: vllm serve m",
        line("07:55:10", "non-default args", "APIServer"),
        line("07:55:20", "Initializing a V1 LLM engine (v0.32.0)"),
        line("07:55:22", "Initializing model took 0.07 seconds"),
        line("07:55:25", "CPU KV cache size: 262,144 tokens"),  # no torch.compile line (eager)
        line("07:55:26", "init engine (profile, create kv cache, warmup model) took 0.10 s"),
        line("07:55:27", "Starting vLLM server on http://127.0.0.1:1", "APIServer"),
    ])
    got = start_phases(text, datetime(2026, 12, 3, 7, 55, 0), 30.0)
    assert got == [("start: imports (API process)", 10.0), ("start: engine process (config, spawn, imports)", 10.0),
                   ("start: model load", 2.0), (UNSPLIT, 4.0),  # torch.compile + KV cache: not split by a guess
                   ("start: API server", 1.0), ("start: until ready (health, introspection)", 3.0)]
    assert sum(s for _, s in got) == 30.0


def test_what_cannot_be_split_is_one_unsplit_span() -> None:
    assert start_phases("no stamped line at all\n", SPAWN, 12.0) == [(UNSPLIT, 12.0)]
    retried = "# studyc: a\nOSError: Address already in use\n# studyc: b\n" + line("07:55:10", "x", "APIServer")
    assert start_phases(retried, SPAWN, 12.0) == [(UNSPLIT, 12.0)]  # a port retry: two spawns in one start
    assert start_phases("", SPAWN, 0.0) == []


def test_stamps_are_clamped_to_the_start() -> None:
    early = line("07:55:00", "first", "APIServer")  # the spawn's own second, stamped without its fraction
    late = line("07:59:00", "Initializing a V1 LLM engine")  # after the measured ready time
    got = start_phases(early + "\n" + late, SPAWN, 5.0)
    assert got == [("start: imports (API process)", 0.0),  # never negative
                   ("start: engine process (config, spawn, imports)", 5.0)]  # never past the total


def test_a_point_is_its_window_plus_ramp_and_drain() -> None:
    phases = {"warmup": 1.5, "reset": 0.25, "scrape_before": 0.25, "measure": 10.0, "judge": 0.5}
    assert point_phases(phases, 7.0) == [("warmup", 1.5), ("reset, scrape", 0.5), ("ramp/drain", 3.0),
                                         ("window", 7.0), ("judge", 0.5)]
    assert point_phases({"measure": 10.0}, 10.0) == [("window", 10.0)]  # nothing outside the window
    assert point_phases({"measure": 10.0}, 12.0) == [("window", 10.0)]  # a window never exceeds the load
    assert point_phases({}, 0.0) == []


def test_a_killed_segment_is_closed_by_the_next_and_every_phase_adds_up(tmp_path: Path) -> None:
    with Store(tmp_path / "r.duckdb") as store:
        store.save_run(RunRecord("run-1", "toy"))
        first = Timeline(store, "run-1", time.monotonic() - 10.0, datetime.now(UTC))
        first.add("toy/a/L1", [("start (unsplit)", 4.0), ("window", 2.0)])  # then killed: never closed
        segments, _ = store.timing("run-1")
        assert [(s.segment, s.ended) for s in segments] == [(1, "running")] and segments[0].wall_s >= 10.0
        second = Timeline(store, "run-1", time.monotonic() - 5.0, datetime.now(UTC))
        second.add("toy/a/L2", [("window", 1.0)])
        second.close("complete", slots=2)
        segments, phases = store.timing("run-1")
    assert [(s.segment, s.ended, s.slots) for s in segments] == [(1, "killed", 1), (2, "complete", 2)]
    for seg in segments:
        mine = [p for p in phases if p.segment == seg.segment]
        assert sum(p.seconds for p in mine) == pytest.approx(seg.wall_s * seg.slots, abs=0.01)
        assert [p.phase for p in mine].count(GAP) == 1
    table = phase_table(segments, phases)
    assert table is not None and table.segments == 2 and table.window_s == 3.0
    assert table.wall_s == pytest.approx(sum(s.wall_s for s in segments))
    assert sum(s for _, s, _ in table.rows) == pytest.approx(table.total_s, abs=0.01)
    assert table.total_s == pytest.approx(segments[0].wall_s + 2 * segments[1].wall_s, abs=0.01)
    assert sum(share for _, _, share in table.rows) == pytest.approx(1.0)
    one = phase_table(segments, phases, "toy/a/L1")
    assert one is not None and one.rows == (("start (unsplit)", 4.0, 4.0 / 6.0), ("window", 2.0, 2.0 / 6.0))
    assert phase_table([], []) is None
    assert "window" in table.text() and "killed, complete" in table.text()


def test_git_sha_reads_the_commit_written_into_a_copied_tree(tmp_path: Path) -> None:
    assert git_sha(tmp_path) is None  # no checkout, nothing written
    (tmp_path / COMMIT_FILE).write_text("0123456789abcdef0123456789abcdef01234567\n")
    assert git_sha(tmp_path) == "0123456789abcdef0123456789abcdef01234567"
    (tmp_path / COMMIT_FILE).write_text("HEAD\n")
    assert git_sha(tmp_path) is None  # not a commit
    (tmp_path / COMMIT_FILE).write_text("0123456789abcdef0123456789abcdef0123456\n")
    assert git_sha(tmp_path) is None  # 39 digits


@pytest.mark.vllm
def test_a_killed_then_resumed_cpu_run_stores_both_segments(tmp_path: Path) -> None:
    """`studyc run` killed (SIGKILL: no cleanup of its own) after its first point, then `--resume`d: the
    run's wall is its two segments', each segment's phases add up to its wall, with a small gap, and the
    start phases add up to the server's measured start."""
    import os
    import re
    import signal

    from tests.conftest import vllm_missing
    from tests.runner.test_run import FAULTS, children, studyc, wait_for_line

    if vllm_missing():
        pytest.skip(str(vllm_missing()))
    db, study = tmp_path / "killed.duckdb", tmp_path / "faults.toml"  # the good arm alone
    text = FAULTS.read_text().replace('path = "../../../models/tiny-qwen3"', f'path = "{REPO / "models/tiny-qwen3"}"')
    study.write_text(re.sub(r"(?ms)^\[arms\.broken\]\n.*?\n\n", "", text, count=1))
    t0 = time.monotonic()
    proc = studyc("run", str(study), "--db", str(db), "--keep-going", "--no-calibrate", start_new_session=True)
    wait_for_line(proc, "faults/good/w/c1/r1: ")
    engines = [p for p in children(proc.pid) if "vllm" in Path(f"/proc/{p}/cmdline").read_text(errors="ignore")]
    proc.kill()
    proc.communicate(timeout=30)
    first_s = time.monotonic() - t0
    for pid in engines:  # the servers run in their own sessions: studyc killed cannot stop them
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    with Store(db, read_only=True) as store:
        run = store.latest_run("faults")
        assert run is not None
        segments, phases = store.timing(run.run_id)
        assert [s.ended for s in segments] == ["running"] and 0 < segments[0].wall_s <= first_s
        assert {"window", "start: until ready (health, introspection)"} <= {p.phase for p in phases}
    t1 = time.monotonic()
    proc = studyc("run", str(study), "--db", str(db), "--resume", "--keep-going", "--no-calibrate")
    out, _ = proc.communicate(timeout=600)
    second_s = time.monotonic() - t1
    assert proc.returncode == 0, out
    print(out)
    with Store(db, read_only=True) as store:
        run = store.run(run.run_id)
        assert run is not None
        segments, phases = store.timing(run.run_id)
        servers = {s.server_id: s for s in store.servers(run.run_id)}
    assert [(s.segment, s.ended) for s in segments] == [(1, "killed"), (2, "complete")]
    assert segments[1].wall_s <= second_s and segments[1].wall_s > second_s - 60  # python and the engine check
    assert run.wall_s == pytest.approx(segments[0].wall_s + segments[1].wall_s, abs=0.002)
    for seg in segments:
        mine = [p for p in phases if p.segment == seg.segment]
        assert sum(p.seconds for p in mine) == pytest.approx(seg.wall_s, abs=0.01)
        gap = sum(p.seconds for p in mine if p.phase == GAP)
        assert -0.01 <= gap < 0.2 * seg.wall_s, (seg, gap)
    for sid, seg in (("faults/good", 1), ("faults/good~2", 2)):
        # the segment's first launch waited for its held imports before its start (startup_s counts from there)
        start = sum(p.seconds for p in phases if p.segment == seg and p.phase.startswith("start")
                    and p.phase != "start: imports (first launch, held)")
        measured = servers[sid].startup_s or 0.0  # spawn to /health; the launch's start adds reading what it is
        assert measured - 0.01 <= start <= measured + 5.0, (sid, start, measured)
    table = phase_table(segments, phases)
    assert table is not None and run.window_s == pytest.approx(table.window_s, abs=0.002) and table.window_s > 0
    assert "where the wall went (2 segment(s): killed, complete" in out


@pytest.mark.vllm
def test_a_real_cpu_run_accounts_for_its_wall(quickstart_db: Path) -> None:
    """The quickstart's real run: one complete segment whose phases add up to the stored wall, which
    matches the run's own start and finish times; its windows are the points' windows."""
    with Store(quickstart_db, read_only=True) as store:
        run = store.latest_run("quickstart")
        assert run is not None
        segments, phases = store.timing(run.run_id)
        points = store.points(run.run_id)
    assert [s.ended for s in segments] == ["complete"] and run.wall_s == segments[0].wall_s
    assert run.started_at and run.finished_at
    assert abs((run.finished_at - run.started_at).total_seconds() - run.wall_s) < 2.0
    assert sum(p.seconds for p in phases) == pytest.approx(run.wall_s, abs=0.01)
    gap = sum(p.seconds for p in phases if p.phase == GAP)
    assert 0 <= gap < 0.1 * run.wall_s, gap
    windows = sum(p.summary.window_s or 0.0 for p in points)
    assert sum(p.seconds for p in phases if p.phase == "window") == pytest.approx(windows, abs=0.01)
    assert run.window_s == pytest.approx(windows, abs=0.01)
    names = {p.phase for p in phases}
    assert {"calibration", "start: model load", "warmup", "ramp/drain", "stop"} <= names
    table = phase_table(segments, phases)
    assert table is not None
    print(table.text())

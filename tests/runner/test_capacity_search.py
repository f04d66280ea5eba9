"""A capacity search against the real CPU server, stored in a real DuckDB and scored: the tiny model with two
sequences per batch holds two requests in flight under a 60 ms TTFT objective (a third waits for a whole
64-token request), so the search [1, 6] brackets its capacity one apart in 4 probes (about 40 s)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from compiler.capacity import replay
from compiler.load import load_study
from compiler.plan import Plan
from report.results import read_run
from report.scoring.capacity import probe_rows, wilson
from report.scoring.score_model import Why
from report.scoring.scoring import score_study
from runner.checks.recheck import recheck
from runner.checks.stats import meets_slo
from runner.store.store import Store
from tests.conftest import REPO, vllm_missing

NEEDS_VLLM = [pytest.mark.vllm, pytest.mark.skipif(vllm_missing() is not None, reason=str(vllm_missing()))]

STUDY = """
[study]
id = "capacity-cpu"
title = "Capacity at an SLO on the CPU"
question = "How many requests in flight does the tiny model hold with two sequences per batch?"
hardware = "cpu"

[model]
path = "{model}"
name = "tiny-qwen3"

[engine]
max_model_len = 2048
max_num_seqs = 2
kv_cache_memory_bytes = "256M"
block_size = 32
enforce_eager = true
distributed_executor_backend = "uni"

[env]
VLLM_ENABLE_V1_MULTIPROCESSING = "0"

[arms.two]
description = "At most 2 sequences in a batch: a third request waits for a whole one"

[workloads.w]
input_len = 64
output_len = 64

[load]
search = {{ concurrency = [1, 6], probes = 4 }}
requests = 24
warmup = 4
launches = 1

[slo]
ttft_ms = 60
attainment = 0.9

[[hypothesis]]
id = "holds-two"
claim = "Two sequences per batch hold at least two requests in flight"
metric = "capacity"
predict = {{ value = 2, relation = ">=" }}
"""


@NEEDS_VLLM[0]
@NEEDS_VLLM[1]
def test_a_capacity_search_brackets_the_capacity_on_the_real_server(tmp_path: Path) -> None:
    study = tmp_path / "capacity.toml"
    study.write_text(STUDY.format(model=REPO / "models/tiny-qwen3"))
    db = tmp_path / "capacity.duckdb"
    proc = subprocess.run([sys.executable, "-m", "studyc", "run", str(study), "--db", str(db), "--no-calibrate"],
                          cwd=REPO, capture_output=True, text=True, timeout=600, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    with Store(db, read_only=True) as store:
        run = store.runs()[0]
        plan = Plan.from_stored(run.plan_json)
        points = store.points(run.run_id)
        records = {p.point_id: store.request_records(run.run_id, p.point_id) for p in points}
    assert plan is not None and plan.slo is not None
    search = plan.launches[0].searches[0]
    assert all(p.status == "ok" and p.valid for p in points), out
    # The probes are the search's, in its order: hi, lo, then bisection; the bracket ends one apart.
    done, found = replay(search, {float(p.concurrency or 0): (p.summary.slo_attainment or 0) >= 0.9 for p in points})
    assert [p.point_id for p in points] == [f"{search.id}/c{int(x.level)}/r1" for x in done]
    assert [x.level for x in done][:2] == [6.0, 1.0] and len(done) <= 4
    assert found.status == "resolved" and found.failed == (found.capacity or 0) + 1, found
    # Attainment and goodput are recomputed from the stored requests, as the bench would count them.
    for p in points:
        measured = [r for r in records[p.point_id] if not r.warmup]
        good = sum(meets_slo(r, plan.slo) for r in measured)
        assert len(measured) == 24 and p.summary.slo_attainment == pytest.approx(good / 24)
        assert 0 <= (p.summary.goodput or 0) <= (p.summary.request_throughput or 0)
    rows = probe_rows(read_run(db, run.run_id), search)
    assert [r.level for r in rows] == sorted(x.level for x in done) and all(r.requests == 24 for r in rows)
    top = rows[-1]
    assert top.level == 6 and top.held is False  # six in flight queue four behind two: most wait > 60 ms
    assert wilson(round((top.attainment or 0) * 24), 24) is not None
    # Scored: one value per launch, so one launch reads "inconclusive (one launch)" whatever it measured.
    score = score_study(load_study(study), read_run(db, run.run_id))[0]
    assert score.measured == found.capacity and score.n == 1 and score.point_ids == (search.id,)
    assert score.verdict == "inconclusive" and Why.ONE_LAUNCH in {r.why for r in score.reasons}, score.reasons
    # Judged again from the stored requests, the probes keep their checks and their attainment.
    assert recheck(db).changed == 0
    with Store(db, read_only=True) as store:
        again = {p.point_id: p.summary.slo_attainment for p in store.points(run.run_id)}
    assert again == {p.point_id: p.summary.slo_attainment for p in points}


def test_a_launch_with_only_searches_left_is_run_and_one_with_nothing_is_not(tmp_path: Path) -> None:
    from compiler.plan_compile import compile_study
    from runner.execute.driver import Driver, Progress, RunOptions, RunReport
    from runner.execute.launch import LaunchSpec

    study = tmp_path / "capacity.toml"
    study.write_text(STUDY.format(model=REPO / "models/tiny-qwen3"))
    plan = compile_study(load_study(study))
    launch = plan.launches[0]
    options = RunOptions(db=tmp_path / "r.duckdb", engine_command=[], python_argv=[], runs_dir=tmp_path)
    with Store(tmp_path / "r.duckdb") as store:
        driver = Driver(store, "run-1", plan, RunReport("run-1"), Progress(), {}, options)

        def spec(searches: tuple) -> LaunchSpec:  # type: ignore[type-arg]
            return LaunchSpec(launch=launch, points=(), run_id="run-1", placement=None,  # type: ignore[arg-type]
                              ctx=None, engine_command=(), log_dir=tmp_path, key_dir=tmp_path,  # type: ignore[arg-type]
                              startup_timeout_s=1.0, searches=searches)

        assert launch.points == () and driver.wanted(spec(launch.searches))
        assert not driver.wanted(spec(()))


WAVES_STUDY = STUDY.replace("""[workloads.w]
input_len = 64
output_len = 64
""", """[workloads.w]
input_len = 64
output_len = 48
turns = 3
think_s = 0.1
""").replace("search = {{ concurrency = [1, 6], probes = 4 }}\nrequests = 24",
             "search = {{ concurrency = [2, 6], probes = 3, waves = 3 }}").replace("ttft_ms = 60", "ttft_ms = 20")


@NEEDS_VLLM[0]
@NEEDS_VLLM[1]
def test_a_multi_turn_search_sends_three_waves_of_conversations_at_every_probe(tmp_path: Path) -> None:
    """kv-capacity-slo's design at the CPU's scale: three-turn conversations, `waves = 3`, so each probe sends
    3 x level conversations (its own, not the top's count) and every probe has a steady phase: all valid."""
    assert "waves = 3" in WAVES_STUDY and "turns = 3" in WAVES_STUDY and "requests =" not in WAVES_STUDY
    study = tmp_path / "waves.toml"
    study.write_text(WAVES_STUDY.format(model=REPO / "models/tiny-qwen3"))
    db = tmp_path / "waves.duckdb"
    proc = subprocess.run([sys.executable, "-m", "studyc", "run", str(study), "--db", str(db), "--no-calibrate"],
                          cwd=REPO, capture_output=True, text=True, timeout=600, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    with Store(db, read_only=True) as store:
        run = store.runs()[0]
        points = store.points(run.run_id)
        sent = {p.point_id: [r for r in store.request_records(run.run_id, p.point_id) if not r.warmup]
                for p in points}
    assert len(points) >= 2 and [p.concurrency for p in points][:2] == [6, 2], out
    for p in points:
        level = p.concurrency or 0
        assert p.status == "ok" and p.valid, (p.point_id, out)
        assert len(sent[p.point_id]) == 3 * level * 3  # 3 waves of `level` conversations of 3 turns
        assert len({r.conversation for r in sent[p.point_id]}) == 3 * level
        assert (p.summary.steady_requests or 0) >= level

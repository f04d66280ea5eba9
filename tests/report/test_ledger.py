"""The step-time model on the committed H200 results: leave-one-study-out numbers pinned so they
cannot drift silently, coverage gaps named, and the plan's prefix-cache replay."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from compiler.plan import Plan, PointStep
from report.ledger import ledger_fit
from report.ledger.ledger import _model_dir, cached_tokens, predict_points, read_points
from report.ledger.ledger_fit import METRICS, gpu_ledger, leave_one_study_out, ledger, not_validated
from report.ledger.ledger_text import format_ledger
from runner.store.store import Store
from tests.conftest import committed_copy

REPO = Path(__file__).resolve().parents[2]
COMMITTED = REPO / "results" / "h200"
LEDGER_KEYS = {"study", "gpu", "vllm_version", "metric", "n", "median_abs_pct_error", "saturated", "worst_point"}


# The latest H200 run of each of the eight studies: the data the pinned numbers below describe. Runs
# added to the committed file later (re-runs, new studies) change the fits, so the pins stay on these.
PINNED_RUNS = ("20261201T042836-0481cd", "20261201T020821-9dbfe5", "20261129T233113-f588ef",
               "20261201T044201-eadc7b", "20261201T022305-b2eded", "20261201T022651-7d0a8d",
               "20261201T042312-aaa653", "20261201T043455-0ec2cf")


def pinned_copy(path: Path) -> Path:
    """The committed H200 results of the pinned runs, migrated to this schema in a copy at `path` (the
    committed file is untouched)."""
    committed_copy("h200", path)
    with Store(path) as store:
        store.con.execute(f"DELETE FROM runs WHERE run_id NOT IN {PINNED_RUNS}")
    return path


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    return pinned_copy(tmp_path_factory.mktemp("h200") / "h200.duckdb")


@pytest.fixture(scope="module")
def small_db(db, tmp_path_factory):
    """Two studies (cuda-graphs, decode-roofline): plan predictions that fit in seconds."""
    path = tmp_path_factory.mktemp("small") / "small.duckdb"
    shutil.copyfile(db, path)
    with Store(path) as store:
        store.con.execute("DELETE FROM runs WHERE study_id NOT IN ('cuda-graphs', 'decode-roofline')")
    return path


def _plan(db, study):
    with Store(db, read_only=True) as store:
        run = next(r for r in store.runs() if r.study_id == study)
    plan = Plan.from_stored(run.plan_json)
    assert plan is not None
    return run.run_id, plan

# Median absolute % error, leave one study out, overlap p and admit_s searched per fold, matmuls and
# attention joined each on its own (the table in the model's notes).
# Not all under 5%: the notes say why for each miss (MoE routing under dummy weights, the 4B model).
# Re-pinned 2026-12-07 when the opening burst reached the engine together and weighed 0.3 in the fit
# (docs/predictions.md, TTFT): n-weighted throughput 4.79% -> 5.27%, TPOT 7.20% -> 6.79%, TTFT 17.47% -> 15.39%.
# Re-pinned 2026-12-07 when a request waited for the step scheduled after it arrived (async scheduling): on
# these eight studies 5.27% -> 5.54%, 6.79% -> 6.64%, 15.39% -> 16.25%; on every study 5.70% -> 5.57%,
# 5.14% -> 5.23%, 18.32% -> 16.90% (docs/predictions.md).
EXPECTED = {
    ("chunked-prefill", "output_throughput"): (6, 12.83),
    ("chunked-prefill", "tpot_s"): (6, 10.22),
    ("cuda-graphs", "output_throughput"): (6, 2.98),
    ("cuda-graphs", "tpot_s"): (6, 4.24),
    ("decode-roofline", "output_throughput"): (3, 1.71),
    ("decode-roofline", "tpot_s"): (3, 1.40),
    ("fp8-kv", "output_throughput"): (24, 3.71),
    ("fp8-kv", "tpot_s"): (24, 1.37),
    ("max-num-seqs", "output_throughput"): (6, 5.94),
    ("max-num-seqs", "tpot_s"): (6, 3.24),
    ("mla-kv", "output_throughput"): (2, 2.63),
    ("mla-kv", "tpot_s"): (2, 1.57),
    ("moe-union", "output_throughput"): (6, 22.41),
    ("moe-union", "tpot_s"): (6, 52.90),
    ("prefix-cache-ladder", "output_throughput"): (22, 2.34),
    ("prefix-cache-ladder", "tpot_s"): (22, 1.54),
}


@pytest.fixture(scope="module")
def points(db):
    """The pinned runs' points, read once for the tests that read them as they are."""
    return read_points(db)


@pytest.fixture(scope="module")
def scored(points):
    return leave_one_study_out(points)


def test_loso_numbers_on_committed_results(scored):
    rows = {(r["study"], r["metric"]): r for r in ledger(scored)}
    for key, (n, median) in EXPECTED.items():
        row = rows[key]
        assert row["n"] == n, key
        assert row["median_abs_pct_error"] == pytest.approx(median, abs=0.3), key
        assert row["gpu"] == "H200" and row["vllm_version"] == "0.26.0"
        assert set(row) == LEDGER_KEYS
        worst = row["worst_point"]
        assert abs(worst["error_pct"]) >= row["median_abs_pct_error"] and worst["why"]


# Per GPU and metric over the eight pinned studies (all H200): (median, median near saturation, the rest's).
BY_GPU = {"output_throughput": (3.19, 9.82, 2.72), "tpot_s": (2.02, 6.47, 1.55), "ttft_s": (13.85, 11.10, 15.69)}


def test_each_metrics_error_per_gpu_with_the_points_near_saturation_apart(scored):
    by_study = ledger(scored)
    rows = {(r["study"], r["metric"]): r for r in by_study}
    by_gpu = {(r["gpu"], r["metric"]): r for r in gpu_ledger(scored)}
    assert set(by_gpu) == {("H200", m) for m in METRICS}
    for metric, (median, near, rest) in BY_GPU.items():
        row = by_gpu[("H200", metric)]
        assert row["n"] == sum(r["n"] for r in by_study if r["metric"] == metric) == 75 and row["studies"] == 8
        # chunked-prefill's 100 users on 64 slots and max-num-seqs' 100 on 32 and 64: every point near saturation
        assert row["saturated"] == rows[("chunked-prefill", metric)]["saturated"] + rows[("max-num-seqs", metric)]["saturated"] == 12
        assert row["median_abs_pct_error"] == pytest.approx(median, abs=0.3)
        assert row["median_abs_pct_error_saturated"] == pytest.approx(near, abs=0.5)
        assert row["median_abs_pct_error_unsaturated"] == pytest.approx(rest, abs=0.3)
        worst = row["worst_point"]
        assert abs(worst["error_pct"]) == max(abs(r["worst_point"]["error_pct"]) for r in by_study if r["metric"] == metric)
    assert rows[("fp8-kv", "tpot_s")]["saturated"] == 0  # 128 users on the default 256 slots, KV far from full
    assert rows[("max-num-seqs", "tpot_s")]["worst_point"]["saturated"] == "concurrency 100 >= max_num_seqs 64"
    text = format_ledger(by_study, [], gpus=gpu_ledger(scored))
    assert "[near saturation: concurrency 100 >= max_num_seqs 64]" in text
    assert "by GPU and metric, every validated point:" in text and "near saturation: the point's concurrency" in text


def test_uncovered_configurations_are_not_scored(scored):
    gaps = {(g["study"], g["n"]): g["reason"] for g in not_validated(scored)}
    assert "eager" in gaps[("cuda-graphs", 6)]
    assert "kv fp8" in gaps[("fp8-kv", 24)]
    assert "qwen3-0.6b" in gaps[("decode-roofline", 3)]
    for s in scored:  # a held-out point is never predicted from coefficients fitted on its own study
        assert not s.validated or s.reason == ""
    assert sum(s.validated for s in scored) == 75


def test_bursts_read_from_the_requests_table(points):
    by_id = {p.point_id: p for p in points if p.run_id}
    kept = by_id["prefix-cache-ladder/kept/ladder/c128/r1"].measured["burst_s"]
    assert kept == pytest.approx(0.5044, abs=0.002)  # 128 cached prompts: mostly the front-end queue
    assert by_id["fp8-kv/bf16/decode/c1/r1"].measured["burst_s"] is None  # one slot: no burst


def test_a_studys_latest_run_replaces_its_earlier_ones(tmp_path):
    # Every cuda-graphs run: only the latest is read. Its plan names its model folder by an absolute
    # path of the checkout it was compiled in, found here under models/.
    path = committed_copy("h200", tmp_path / "two.duckdb")
    with Store(path) as store:
        store.con.execute("DELETE FROM runs WHERE study_id != 'cuda-graphs'")
        assert len(store.runs()) == 3
    points = read_points(path)
    assert {p.run_id for p in points} == {"20261201T202615-d1cd5a"} and len(points) == 12
    assert _model_dir("/elsewhere/models/qwen3-8b", REPO) == REPO / "models" / "qwen3-8b"
    assert _model_dir("/elsewhere/qwen3-8b", REPO) == Path("/elsewhere/qwen3-8b")  # not found: as given


def test_kept_cache_hits_follow_plan_order():
    base = {"prompt_seed": 0, "input_len": 1024, "vocab_lo": 0, "vocab_hi": 100, "prefix_len": 0, "arm": "a",
            "workload": "w", "concurrency": 1, "rate_rps": None, "repeat": 1, "warmup": 0, "output_len": 8,
            "arrival": "poisson", "burstiness": 1.0, "request_timeout_s": 60.0, "point_timeout_s": None,
            "estimated_s": 1.0, "fingerprint": "f"}
    points = [PointStep.model_validate({**base, **p}) for p in (
        {"id": "c1/r1", "cache": "keep", "requests": 16},
        {"id": "c8/r1", "cache": "keep", "requests": 64},
        {"id": "c1/r2", "cache": "keep", "requests": 16},
        {"id": "c1/r3", "cache": "reset", "requests": 16},
    )]
    hits = cached_tokens(points)
    assert hits["c1/r1"] == (0,) * 16
    assert hits["c8/r1"] == (1008,) * 16 + (0,) * 48  # 16 of 64 prompts seen: hit rate 0.246
    assert hits["c1/r2"] == (1008,) * 16
    assert hits["c1/r3"] == (0,) * 16


def predict_plan(plan, db, exclude_runs=()):
    """What `studyc run` asks (studyc.predictions): predictions for a plan from the stored points but a run's."""
    points = [p for p in read_points(db) if p.run_id not in set(exclude_runs)]
    return {pid: pp.values for pid, pp in predict_points(plan, points).items()}


def test_predict_plan_from_db(small_db):
    _, plan = _plan(small_db, "cuda-graphs")
    predicted = predict_plan(plan, small_db)
    assert set(predicted) == {p.id for p in plan.points}
    c1 = predicted["cuda-graphs/graphs/decode/c1/r1"]
    assert c1["output_throughput"] == pytest.approx(189, rel=0.06)  # measured 189 tok/s (in-sample fit)
    assert predicted["cuda-graphs/eager/decode/c1/r1"]["tpot_s"] > 3 * c1["tpot_s"]
    unknown = predict_plan(plan.model_copy(update={"hardware": "NVIDIA GeForce RTX 4090"}), small_db)
    assert all(v is None for p in unknown.values() for v in p.values())  # not in the table, never calibrated


def test_predict_plan_never_fits_on_excluded_run(small_db):
    run_id, plan = _plan(small_db, "cuda-graphs")
    predicted = predict_plan(plan, small_db, exclude_runs=[run_id])
    assert all(v is None for v in predicted["cuda-graphs/eager/decode/c1/r1"].values())  # only this run is eager
    assert predicted["cuda-graphs/graphs/decode/c1/r1"]["tpot_s"] == pytest.approx(0.00518, rel=0.03)


def test_folds_fitted_in_worker_processes_are_the_folds_fitted_here(small_db, monkeypatch):
    points = read_points(small_db)
    monkeypatch.setattr(ledger_fit, "_FITS", {})
    here = leave_one_study_out(points, workers=1)
    fitted_here = dict(ledger_fit._FITS)
    monkeypatch.setattr(ledger_fit, "_FITS", {})
    apart = leave_one_study_out(points, workers=2)
    assert len(fitted_here) >= 2 and ledger_fit._FITS == fitted_here  # two folds, each its own fit
    assert here == apart and any(s.validated for s in here)


def test_fits_kept_on_disk_answer_the_next_command_without_fitting(small_db, monkeypatch, tmp_path):
    """STUDYC_FIT_CACHE on: the folds' fits are written under the cache folder; a fresh process (no fit
    in memory) reads them back and fits nothing, with the same results. Off: nothing is written."""
    points = read_points(small_db)
    monkeypatch.setenv("STUDYC_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("STUDYC_FIT_CACHE", "0")
    monkeypatch.setattr(ledger_fit, "_FITS", {})
    fitted = leave_one_study_out(points, workers=1)
    assert not (tmp_path / "fits").exists()
    monkeypatch.setenv("STUDYC_FIT_CACHE", "1")
    monkeypatch.setattr(ledger_fit, "_FITS", {})
    assert leave_one_study_out(points, workers=2) == fitted
    kept = sorted((tmp_path / "fits").iterdir())
    assert len(kept) == len(ledger_fit._FITS) >= 2

    def no_fit(*_):
        raise AssertionError("fitted again")

    monkeypatch.setattr(ledger_fit, "_fitted", no_fit)
    monkeypatch.setattr(ledger_fit, "_FITS", {})
    assert leave_one_study_out(points, workers=2) == fitted
    assert sorted((tmp_path / "fits").iterdir()) == kept


@pytest.mark.parametrize(("named", "workers"), [("3", 3), ("1", 1), ("0", None), ("", None), ("x", None)])
def test_fit_workers_reads_the_environment_else_the_cpus(monkeypatch, named, workers):
    monkeypatch.setenv("STUDYC_FIT_WORKERS", named)
    assert ledger_fit.fit_workers() == (workers or len(os.sched_getaffinity(0)))

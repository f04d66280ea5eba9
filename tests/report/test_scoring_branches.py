"""Scoring, branch by branch, on stored runs built as typed records: every field of a Score for each
prediction kind and verdict, intervals read at the plan's launches, blocks and sequential looks, server
metrics, failed and unmeasured points, and the model folder and dtypes an expression is evaluated with."""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
from pathlib import Path
from typing import Any

import pytest

from compiler.hardware import get_hardware
from compiler.load import LoadedStudy, load_study
from compiler.modelconfig import ModelError, load_model
from compiler.study import Where
from report.results import RunData
from report.scoring.context import model_dir, serving_dtypes
from report.scoring.prediction import Resolved, resolve_prediction
from report.scoring.score_model import Reason, Score, Why
from report.scoring.scoring import UNEVALUABLE, score_study
from report.scoring.sides import NOT_FINITE, NOT_RECORDED, SERVER_NOT_RECORDED, WITHHELD
from report.stats.intervals import Obs, fixed_critical, ratio_interval, t_quantile
from runner.store.records import CheckResult, PointRecord, PointSummary, RunRecord, ServerRecord
from tests.report.helpers import TINY_MODEL, plan_json

RUN = "run-1"
TPUT = "output_throughput"


# ---- fixtures: a study on disk, a run in memory --------------------------------------------------------


def make_models(tmp: Path) -> None:
    """m/base: the tiny model; m/big: the same with twice the layers."""
    base, big = tmp / "m" / "base", tmp / "m" / "big"
    base.mkdir(parents=True)
    shutil.copy(TINY_MODEL / "config.json", base / "config.json")
    big.mkdir(parents=True)
    cfg = json.loads((TINY_MODEL / "config.json").read_text())
    cfg["num_hidden_layers"] = 4
    (big / "config.json").write_text(json.dumps(cfg))


def study(tmp: Path, hypotheses: str, *, dtype: str = "auto", engine: str = "") -> LoadedStudy:
    """Arms a (the study's model) and b (m/big, fp8 KV); workload w; concurrency 1 and 4; cpu."""
    if not (tmp / "m").exists():
        make_models(tmp)
    path = tmp / "toy.toml"
    path.write_text(f'''
[study]
id = "toy"
title = "Toy"
question = "Does the toy behave?"
hardware = "cpu"

[model]
path = "m/base"
dtype = "{dtype}"

[engine]
max_model_len = 2048
{engine}

[arms.a]
description = "arm a"

[arms.b]
description = "arm b"
model = "m/big"
kv_cache_dtype = "fp8"

[workloads.w]
input_len = 128
output_len = 32

[load]
concurrency = [1, 4]
requests = 8
warmup = 2
repeats = 3
{hypotheses}
''')
    return load_study(path)


def hyp(hid: str, metric: str, where: str, predict: str) -> str:
    return f'''
[[hypothesis]]
id = "{hid}"
claim = "claim {hid}"
metric = "{metric}"
where = {where}
predict = {predict}
'''


def pid(arm: str, concurrency: int, tag: str) -> str:
    return f"toy/{arm}/w/c{concurrency}/{tag}"


def point(arm: str, concurrency: int, tag: str, value: float | None, *, metric: str = TPUT, status: str = "ok",
          error: str | None = None, valid: bool = True, cache: str = "reset", repeat: int = 1) -> PointRecord:
    return PointRecord(
        run_id=RUN, point_id=pid(arm, concurrency, tag), server_id=f"toy/{arm}", arm=arm, workload="w",
        concurrency=concurrency, repeat=repeat, status=status, error=error, cache_policy=cache,
        valid=valid, summary=PointSummary(**({} if value is None else {metric: value})),  # type: ignore[arg-type]
    )


def failed(point_id: str, name: str, severity: str = "fail") -> CheckResult:
    return CheckResult(point_id, name, False, severity, 1.0, 0.5, f"{name} detail")  # type: ignore[arg-type]


def server(sid: str, arm: str, kv: int | None, *, status: str = "ready", error: str | None = None,
           compile_cache: str | None = None) -> ServerRecord:
    return ServerRecord(run_id=RUN, server_id=sid, arm=arm, kv_capacity_tokens=kv, status=status, error=error,
                        compile_cache=compile_cache)


def run(points: list[PointRecord] = (), servers: list[ServerRecord] = (),  # type: ignore[assignment]
        checks: list[CheckResult] = (), plan: dict[str, Any] | None = None,  # type: ignore[assignment]
        calibrated: bool = False, bandwidth: float | None = None, flops: float | None = None) -> RunData:
    record = RunRecord(run_id=RUN, study_id="toy", plan_json=plan_json(plan) if plan else "{}",
                       calibrated=calibrated, bandwidth_Bps=bandwidth, flops_bf16=flops)
    return RunData(Path("mem.duckdb"), record, tuple(servers), tuple(points), tuple(checks), ())


def launch(lid: str, block: int, points: list[tuple[str, int, str]] = (),  # type: ignore[assignment]
           server_ids: list[str] | None = None) -> dict[str, Any]:
    """A v2 plan launch; points as (id, repeat, why not exchangeable or "")."""
    return {"id": lid, "block": block, "server_ids": server_ids or [lid],
            "points": [{"id": p, "repeat": r, "exchangeable": not why, "not_exchangeable_because": why}
                       for p, r, why in points]}


def scores(loaded: LoadedStudy, data: RunData | None) -> dict[str, Score]:
    return {s.hypothesis: s for s in score_study(loaded, data)}


def with_hypothesis(loaded: LoadedStudy, **update: Any) -> LoadedStudy:
    """The study with its first hypothesis changed past validation (what a stale stored study can hold)."""
    study = loaded.study
    first = study.hypothesis[0].model_copy(update=update)
    return dataclasses.replace(loaded, study=study.model_copy(update={"hypothesis": [first]}))


FIELDS = [f.name for f in dataclasses.fields(Score)]


def assert_score(s: Score, **want: Any) -> None:
    """Every field of the score, floats to 1e-9 relative."""
    assert sorted(want) == sorted(FIELDS)
    for name in FIELDS:
        got, expected = getattr(s, name), want[name]
        if isinstance(expected, float):
            assert got == pytest.approx(expected, rel=1e-9), name
        elif isinstance(expected, tuple) and expected and all(isinstance(x, float) for x in expected):
            assert got == pytest.approx(expected, rel=1e-9), name
        else:
            assert got == expected, name


def base(**kw: Any) -> dict[str, Any]:
    """The fields every test states, with the defaults of a toy value score."""
    out: dict[str, Any] = dict(
        study_id="toy", metric=TPUT, unit="tok/s", kind="value", relation=None, tolerance=0.05, ratio=False,
        band_low_spec=None, band_high_spec=None, values=(), n=0, measured=None, ci_low=None, ci_high=None,
        spread_low=None, spread_high=None, error=None, error_spec=None, off_band=None, off_band_spec=None,
        run_id=RUN, calibrated=False, checks=(), flags=(), reasons=(), point_ids=(), interval="", confidence=0.95,
        look=None, alpha_ledger=None, set_aside=None,
    )
    out.update(kw)
    return out


# ---- value: one launch of three repeats --------------------------------------------------------------


ONE_CONFIRMED = Reason(Why.ONE_LAUNCH, detail="its 95% interval rests on the repeats of one launch per arm and would read confirmed",
                       decide="at least 3 launches per arm (from its repeats' spread; launches vary at least as much)")


def test_value_on_one_launch_every_field(tmp_path: Path) -> None:
    loaded = study(tmp_path, hyp("v", TPUT, "{ arm = \"a\", concurrency = 1 }", "{ value = 100.0, tolerance = 0.05 }"))
    data = run([point("a", 1, f"r{r}", v, repeat=r) for r, v in ((2, 102.0), (1, 101.0), (3, 103.0))])
    half = t_quantile(0.975, 2) * 1.0 / math.sqrt(3)
    s = scores(loaded, data)["v"]
    assert_score(s, **base(
        hypothesis="v", claim="claim v", targets=("a/w/1",), predicted=100.0, predicted_spec=100.0,
        band_low=95.0, band_high=105.0, band_low_spec=95.0, band_high_spec=105.0,
        values=(101.0, 102.0, 103.0), n=3, measured=102.0, ci_low=102.0 - half, ci_high=102.0 + half,
        spread_low=101.0, spread_high=103.0, error=0.02, error_spec=0.02, off_band=0.0, off_band_spec=0.0,
        verdict="inconclusive", verdict_spec="inconclusive",  # inside the band, but on one launch
        reasons=(Reason(Why.NOT_CALIBRATED), dataclasses.replace(ONE_CONFIRMED, decide=ONE_CONFIRMED.decide.replace(
            "at least 3", "at least 4"))),
        point_ids=(pid("a", 1, "r1"), pid("a", 1, "r2"), pid("a", 1, "r3")),
        interval="t on 3 repeats of one launch, df 2",
    ))
    assert (s.verdict_label, s.verdict_spec_label) == ("inconclusive (one launch)",) * 2
    assert s.notes[-1] == ("inconclusive (one launch): launch-to-launch variation is not in it (its 95% interval "
                           "rests on the repeats of one launch per arm and would read confirmed); what would decide "
                           "it: at least 4 launches per arm (from its repeats' spread; launches vary at least as much)")


def test_no_run_is_not_run_without_any_reason(tmp_path: Path) -> None:
    loaded = study(tmp_path, hyp("v", TPUT, "{ arm = \"a\", concurrency = 1 }", "{ value = 100.0 }"))
    assert_score(scores(loaded, None)["v"], **base(
        hypothesis="v", claim="claim v", targets=("a/w/1",), predicted=100.0, predicted_spec=100.0,
        band_low=95.0, band_high=105.0, band_low_spec=95.0, band_high_spec=105.0,
        verdict="not run", verdict_spec="not run", run_id=None,
    ))


def test_no_points_for_the_selector(tmp_path: Path) -> None:
    loaded = study(tmp_path, hyp("v", TPUT, "{ arm = \"a\", concurrency = 4 }", "{ value = 100.0 }"))
    s = scores(loaded, run([point("a", 1, "r1", 100.0)]))["v"]
    assert_score(s, **base(
        hypothesis="v", claim="claim v", targets=("a/w/4",), predicted=100.0, predicted_spec=100.0,
        band_low=95.0, band_high=105.0, band_low_spec=95.0, band_high_spec=105.0,
        verdict="not run", verdict_spec="not run", reasons=(Reason(Why.NOT_CALIBRATED), Reason(Why.NO_POINTS)),
    ))
    assert s.notes[-1] == "no measured points for this selector in the run"


def test_points_without_the_metric_are_not_measured(tmp_path: Path) -> None:
    loaded = study(tmp_path, hyp("v", TPUT, "{ arm = \"a\", concurrency = 1 }", "{ value = 100.0 }"))
    data = run([point("a", 1, "r1", None), point("a", 1, "r2", math.inf, repeat=2),
                point("a", 1, "r3", math.nan, repeat=3)])
    s = scores(loaded, data)["v"]
    assert_score(s, **base(
        hypothesis="v", claim="claim v", targets=("a/w/1",), predicted=100.0, predicted_spec=100.0,
        band_low=95.0, band_high=105.0, band_low_spec=95.0, band_high_spec=105.0,
        verdict="not run", verdict_spec="not run",
        reasons=(Reason(Why.NOT_CALIBRATED),
                 Reason(Why.MISSING_VALUES, count=2,
                        detail=f"{TPUT} {NOT_FINITE} ({pid('a', 1, 'r2')}, {pid('a', 1, 'r3')})"),
                 Reason(Why.MISSING_VALUES, count=1, detail=f"{TPUT} {NOT_RECORDED} ({pid('a', 1, 'r1')})"),
                 Reason(Why.NOT_MEASURED, detail=TPUT)),
        point_ids=(pid("a", 1, "r1"), pid("a", 1, "r2"), pid("a", 1, "r3")),
    ))
    assert s.notes[-1] == f"metric {TPUT} was not measured on these points"
    assert s.notes[1] == f"2 point(s) left out, without the metric: {TPUT} not a finite number ({pid('a', 1, 'r2')}, " \
        f"{pid('a', 1, 'r3')})"


def test_withheld_itl_percentiles_are_counted_with_their_cause(tmp_path: Path) -> None:
    """The failing case: two of three points had their ITL p95 withheld by itl_trusted; the score says
    how many and why, and rests on the one point left. A point that failed itl_trusted only as
    unverified withholds nothing, so a missing value there is 'not recorded'."""
    loaded = study(tmp_path, hyp("itl", "itl_p95_s", "{ arm = \"a\", concurrency = 1 }", "{ value = 0.01 }"))
    pts = [point("a", 1, "r1", 0.01, metric="itl_p95_s"), point("a", 1, "r2", None, repeat=2),
           point("a", 1, "r3", None, repeat=3)]
    bunched = [failed(pid("a", 1, "r2"), "itl_trusted", "warn"), failed(pid("a", 1, "r3"), "itl_trusted", "warn")]
    s = scores(loaded, run(pts, checks=bunched))["itl"]
    want = Reason(Why.MISSING_VALUES, count=2,
                  detail=f"itl_p95_s {WITHHELD} ({pid('a', 1, 'r2')}, {pid('a', 1, 'r3')})")
    alone = Reason(Why.ONE_LAUNCH, detail="a single value, no interval; alone it would read confirmed",
                   decide="at least 2 launches per arm, for an interval between launches")
    assert s.reasons == (Reason(Why.NOT_CALIBRATED), want, alone) and s.n == 1
    assert s.flags == (f"warning itl_trusted on {pid('a', 1, 'r2')}, {pid('a', 1, 'r3')}",)
    unverified = [CheckResult(pid("a", 1, "r2"), "itl_trusted", False, "warn", None, 0.25, "d", "unverified")]
    s = scores(loaded, run(pts[:2], checks=unverified))["itl"]
    assert s.reasons[1] == Reason(Why.MISSING_VALUES, count=1, detail=f"itl_p95_s {NOT_RECORDED} ({pid('a', 1, 'r2')})")
    # a metric itl_trusted does not withhold is not 'withheld' on a point that failed it
    tpot = with_hypothesis(loaded, metric="tpot_p95_s")
    s = scores(tpot, run([point("a", 1, "r1", 0.01, metric="tpot_p95_s"), pts[1]], checks=bunched[:1]))["itl"]
    assert s.reasons[1].detail == f"tpot_p95_s {NOT_RECORDED} ({pid('a', 1, 'r2')})"


def test_every_point_with_the_metric_reports_nothing_missing(tmp_path: Path) -> None:
    """The clean case: no point lacks the metric, so no reason is added."""
    loaded = study(tmp_path, hyp("itl", "itl_p95_s", "{ arm = \"a\", concurrency = 1 }", "{ value = 0.01 }"))
    s = scores(loaded, run([point("a", 1, "r1", 0.01, metric="itl_p95_s")]))["itl"]
    assert not s.has(Why.MISSING_VALUES) and s.n == 1


# ---- relation >= on two launches, read at a sequential look ------------------------------------------


def test_relation_at_a_sequential_look_with_kept_cache_and_warnings(tmp_path: Path) -> None:
    loaded = study(tmp_path, hyp("keep", TPUT, "{ arm = \"b\", concurrency = 4 }", "{ relation = \">=\", value = 100.0 }"))
    cold = "cache = keep: cold first repeat"
    values = {("L1", 1): 50.0, ("L1", 2): 100.0, ("L1", 3): 102.0, ("L2", 1): 60.0, ("L2", 2): 104.0, ("L2", 3): 106.0}
    pts = [point("b", 4, f"{lid}r{r}", v, cache="keep", repeat=r) for (lid, r), v in values.items()]
    plan = {"launches": [launch(lid, block, [(pid("b", 4, f"{lid}r{r}"), r, cold if r == 1 else "")
                                             for r in (1, 2, 3)]) for lid, block in (("L1", 1), ("L2", 2))],
            "design": {"launches": {"a": 3, "b": 3}, "budget": {"blocks": 4}}}
    checks = [failed(pid("b", 4, "L1r2"), "littles_law", "warn"), failed(pid("b", 4, "L2r3"), "cache_cold", "warn")]
    s = scores(loaded, run(pts, checks=checks, plan=plan))["keep"]
    # blocks 2 of at most 4, first look after 3: an early look's share of alpha, 0.05 * 0.2 / 1
    half = t_quantile(1 - 0.01 / 2, 1) * 2.0
    ids = sorted(p.point_id for p in pts)
    assert_score(s, **base(
        hypothesis="keep", claim="claim keep", kind="relation", relation=">=", tolerance=None,
        targets=("b/w/4",), predicted=100.0, predicted_spec=100.0, band_low=100.0, band_high=None,
        band_low_spec=100.0, values=(101.0, 105.0), n=2, measured=103.0, ci_low=103.0 - half,
        ci_high=103.0 + half, spread_low=101.0, spread_high=105.0, off_band=0.0, off_band_spec=0.0,
        verdict="inconclusive", verdict_spec="inconclusive", checks=("cache_cold", "littles_law"),
        flags=(f"prefix cache kept between points (cache = keep) on {', '.join(ids)}",
               f"warning littles_law on {pid('b', 4, 'L1r2')}"),
        reasons=(Reason(Why.NOT_CALIBRATED), Reason(Why.NOT_EXCHANGEABLE, point=pid("b", 4, "L1r1"), detail=cold),
                 Reason(Why.NOT_EXCHANGEABLE, point=pid("b", 4, "L2r1"), detail=cold),
                 Reason(Why.STRADDLES, edge=100.0, unit="tok/s", label="99% interval, look 2 of 4",
                        decide="more blocks than the budget's 4 at this spread (a new run with a larger budget)")),
        point_ids=tuple(pid("b", 4, f"{lid}r{r}") for r in (1, 2, 3) for lid in ("L1", "L2")),  # by repeat
        interval="t on 2 launch means, df 1", confidence=0.99, look=(2, 4),
    ))
    assert s.interval_label == "99% interval, look 2 of 4"


def test_a_fixed_design_reads_the_plain_t_interval(tmp_path: Path) -> None:
    loaded = study(tmp_path, hyp("v", TPUT, "{ arm = \"a\", concurrency = 1 }", "{ relation = \">\", value = 90.0 }"))
    pts = [point("a", 1, "L1", 100.0), point("a", 1, "L2", 104.0)]
    plan = {"launches": [launch("L1", 1, [(pid("a", 1, "L1"), 1, "")]), launch("L2", 2, [(pid("a", 1, "L2"), 1, "")])]}
    s = scores(loaded, run(pts, plan=plan))["v"]
    half = t_quantile(0.975, 1) * 2.0
    assert (s.ci_low, s.ci_high) == pytest.approx((102.0 - half, 102.0 + half))
    assert s.verdict == "inconclusive" and s.reasons == (
        Reason(Why.NOT_CALIBRATED), Reason(Why.STRADDLES, edge=90.0, unit="tok/s", label="95% interval",
                                           decide="about 3 launches per arm at this spread"))
    assert (s.interval_label, s.look, s.verdict_label) == ("95% interval", None, "inconclusive")  # no look
    assert s.notes[-1] == ("the 95% interval straddles the band edge 90 tok/s: what would decide it: about 3 "
                           "launches per arm at this spread")


def test_relation_below_a_threshold_straddled(tmp_path: Path) -> None:
    loaded = study(tmp_path, hyp("lt", "ttft_p50_s", "{ arm = \"a\", concurrency = 1 }", "{ relation = \"<\", value = 0.2 }"))
    pts = [point("a", 1, f"r{r}", v, metric="ttft_p50_s", repeat=r) for r, v in ((1, 0.1), (2, 0.3))]
    s = scores(loaded, run(pts))["lt"]
    assert s.verdict == "inconclusive" and (s.band_low, s.band_high) == (None, 0.2)
    assert s.reasons[-1] == Reason(  # one launch: the one-launch note names the edge it straddles
        Why.ONE_LAUNCH, detail="its 95% interval rests on the repeats of one launch per arm and straddles 200 ms",
        decide="more than 100 launches per arm at its repeats' spread (the mean sits at an edge)")
    assert not s.has(Why.STRADDLES) and s.verdict_label == "inconclusive (one launch)"
    assert s.unit == "s" and s.off_band == 0.0


# ---- server metrics: a ratio of arms paired by block -------------------------------------------------


def test_server_metric_ratio_of_arms_paired_by_block(tmp_path: Path) -> None:
    loaded = study(tmp_path, hyp("kv", "kv_capacity_tokens", "{}", "{ ratio = [\"b\", \"a\"], range = [1.0, 2.0] }"))
    servers = [server("toy/b/2", "b", 1760), server("toy/b/1", "b", 1500), server("toy/a/2", "a", 1100),
               server("toy/a/1", "a", 1000)]
    plan = {"launches": [launch(f"L{arm}{b}", b, server_ids=[f"toy/{arm}/{b}"]) for arm in "ab" for b in (1, 2)]}
    s = scores(loaded, run(servers=servers, plan=plan, calibrated=True, bandwidth=10e9))["kv"]
    logs = [math.log(1.5), math.log(1.6)]
    mean = sum(logs) / 2
    half = t_quantile(0.975, 1) * abs(logs[1] - logs[0]) / 2
    assert_score(s, **base(
        hypothesis="kv", claim="claim kv", metric="kv_capacity_tokens", unit="ratio", kind="range", tolerance=None,
        ratio=True, targets=("b", "a"), predicted=1.5, predicted_spec=1.5, band_low=1.0, band_high=2.0,
        band_low_spec=1.0, band_high_spec=2.0, values=(1.5, 1.6), n=2, measured=math.exp(mean),
        ci_low=math.exp(mean - half), ci_high=math.exp(mean + half), spread_low=1.5, spread_high=1.6,
        off_band=0.0, off_band_spec=0.0, verdict="inconclusive", verdict_spec="inconclusive", calibrated=True,
        reasons=(Reason(Why.STRADDLES, edge=2.0, unit="x", label="95% interval",
                        decide="about 3 launches per arm at this spread"),),
        point_ids=("toy/b/1", "toy/b/2", "toy/a/1", "toy/a/2"),
        interval="paired: t on 2 block log-ratios, df 1",
    ))
    assert s.notes == ("the 95% interval straddles the band edge 2x: what would decide it: about 3 launches per "
                       "arm at this spread",)


def test_a_start_that_compiled_is_left_out_of_a_server_metric(tmp_path: Path) -> None:
    """The H200 fp8-kv run's KV capacities: a start that compiled its graphs reports less than the
    starts that loaded them. Among warm starts it is left out; when every start compiled, none is."""
    loaded = study(tmp_path, hyp("kv", "kv_capacity_tokens", "{}", "{ ratio = [\"b\", \"a\"], value = 1.94, tolerance = 0.03 }"))
    plan = {"launches": [launch(f"L{arm}{b}", b, server_ids=[f"toy/{arm}/{b}"]) for arm in "ab" for b in (1, 2, 3)]}
    kv = {"a": (818048, 818048, 818048), "b": (1628304, 1635648, 1635648)}
    cold = [server(f"toy/{arm}/{b}", arm, kv[arm][b - 1], compile_cache="cold" if (arm, b) == ("b", 1) else "warm")
            for arm in "ab" for b in (1, 2, 3)]
    s = scores(loaded, run(servers=cold, plan=plan))["kv"]
    assert s.values == pytest.approx((1635648 / 818048,) * 2) and s.n == 2
    assert s.verdict == "refuted" and s.ci_low == pytest.approx(1635648 / 818048)  # just above 1.94 x 1.03
    assert any("toy/b/1: left out of the interval, not exchangeable (its start compiled the graphs" in n
               for n in s.notes), s.notes
    every = [dataclasses.replace(x, compile_cache="cold") for x in cold]  # one state throughout: all kept
    s = scores(loaded, run(servers=every, plan=plan))["kv"]
    assert s.n == 3 and s.verdict == "inconclusive"
    assert not any("not exchangeable" in n for n in s.notes)


def test_server_metric_without_a_plan_one_launch_per_server(tmp_path: Path) -> None:
    loaded = study(tmp_path, hyp("kv", "kv_capacity_tokens", "{ arm = \"a\" }", "{ value = 1000.0, tolerance = 0.2 }"))
    servers = [server("toy/a/2", "a", 1100), server("toy/a/1", "a", 900), server("toy/b/1", "b", 5)]
    s = scores(loaded, run(servers=servers))["kv"]
    half = t_quantile(0.975, 1) * 100.0
    assert s.values == (900.0, 1100.0) and s.point_ids == ("toy/a/1", "toy/a/2")
    assert (s.ci_low, s.ci_high) == pytest.approx((1000.0 - half, 1000.0 + half))
    assert s.interval == "t on 2 launch means, df 1" and s.unit == "tokens"
    decide = "about 7 launches per arm at this spread"
    assert s.reasons == (Reason(Why.NOT_CALIBRATED),
                         Reason(Why.STRADDLES, edge=800.0, unit="tokens", label="95% interval", decide=decide),
                         Reason(Why.STRADDLES, edge=1200.0, unit="tokens", label="95% interval", decide=decide))


def test_failed_servers_make_the_score_invalid(tmp_path: Path) -> None:
    hyps = (hyp("a", "kv_capacity_tokens", "{ arm = \"a\" }", "{ value = 1000.0 }")
            + hyp("b", "kv_capacity_tokens", "{ arm = \"b\" }", "{ value = 1000.0 }"))
    loaded = study(tmp_path, hyps)
    servers = [server("toy/a/1", "a", 1000, status="failed", error="oom"), server("toy/b/1", "b", None, status="failed")]
    by_id = scores(loaded, run(servers=servers))
    a, b = by_id["a"], by_id["b"]
    assert (a.verdict, a.verdict_spec, b.verdict, b.verdict_spec) == ("invalid",) * 4
    assert a.reasons == (Reason(Why.NOT_CALIBRATED), Reason(Why.SERVER_FAILED, point="toy/a/1", detail="oom"))
    assert b.reasons == (Reason(Why.NOT_CALIBRATED), Reason(Why.SERVER_FAILED, point="toy/b/1", detail=""))
    assert a.notes[-1] == "toy/a/1: server failed (oom)" and b.notes[-1] == "toy/b/1: server failed (no detail)"
    assert a.values == (1000.0,) and a.n == 1 and a.point_ids == ("toy/a/1",)
    assert b.values == () and b.measured is None and b.point_ids == ("toy/b/1",)


def test_server_metric_missing_is_not_measured(tmp_path: Path) -> None:
    loaded = study(tmp_path, hyp("kv", "kv_capacity_tokens", "{ arm = \"a\" }", "{ value = 1000.0 }"))
    s = scores(loaded, run(servers=[server("toy/a/1", "a", None)]))["kv"]
    assert s.verdict == "not run" and s.interval == "" and s.n == 0
    assert s.reasons == (Reason(Why.NOT_CALIBRATED),
                         Reason(Why.MISSING_VALUES, count=1, detail=f"kv_capacity_tokens {SERVER_NOT_RECORDED} (toy/a/1)"),
                         Reason(Why.NOT_MEASURED, detail="kv_capacity_tokens"))


# ---- points that did not finish, failed checks, warnings ---------------------------------------------


def test_point_status_and_failed_checks(tmp_path: Path) -> None:
    hyps = (hyp("status", TPUT, "{ arm = \"a\", concurrency = 1 }", "{ value = 100.0 }")
            + hyp("marked", TPUT, "{ arm = \"a\", concurrency = 4 }", "{ value = 100.0 }")
            + hyp("check", TPUT, "{ arm = \"b\", concurrency = 1 }", "{ value = 100.0 }"))
    loaded = study(tmp_path, hyps)
    pts = [point("a", 1, "r1", 100.0, status="failed", error="boom"),
           point("a", 1, "r2", None, status="timeout", repeat=2),
           point("a", 4, "r1", 100.0, valid=False),
           point("b", 1, "r1", 100.0), point("b", 1, "r2", 100.0, repeat=2)]
    checks = [failed(pid("b", 1, "r1"), "littles_law"), failed(pid("b", 1, "r1"), "errors"),
              failed(pid("b", 1, "r2"), "cache_cold", "warn"), failed(pid("a", 1, "r1"), "errors")]
    by_id = scores(loaded, run(pts, checks=checks))
    status, marked, check = by_id["status"], by_id["marked"], by_id["check"]
    assert status.reasons == (Reason(Why.NOT_CALIBRATED),
                              Reason(Why.POINT_STATUS, point=pid("a", 1, "r1"), detail="failed (boom)"),
                              Reason(Why.POINT_STATUS, point=pid("a", 1, "r2"), detail="timeout"))
    assert status.notes[1:] == (f"{pid('a', 1, 'r1')}: status failed (boom)", f"{pid('a', 1, 'r2')}: status timeout")
    assert status.checks == ("errors",) and status.flags == () and status.verdict == "invalid"
    assert status.measured == 100.0  # the statistics stay for the page, the verdict does not
    assert marked.reasons == (Reason(Why.NOT_CALIBRATED), Reason(Why.FAILED_CHECK, point=pid("a", 4, "r1")))
    assert marked.notes[-1] == f"{pid('a', 4, 'r1')}: failed check (marked invalid)"
    assert check.reasons == (Reason(Why.NOT_CALIBRATED),  # invalid: no one-launch note, no verdict to cap
                             Reason(Why.FAILED_CHECK, point=pid("b", 1, "r1"), checks=("errors", "littles_law")))
    assert check.checks == ("cache_cold", "errors", "littles_law")
    assert check.flags == (f"warning cache_cold on {pid('b', 1, 'r2')}",)  # reset points: a cold cache warns
    assert (check.verdict, check.verdict_spec) == ("invalid", "invalid")


# ---- ratios: zero denominators, exchangeability, pairing ---------------------------------------------


RATIO_AB = "{ ratio = [\"a\", \"b\"], range = [0.5, 2.0] }"


def test_a_zero_denominator_mean_leaves_no_interval(tmp_path: Path) -> None:
    loaded = study(tmp_path, hyp("r", TPUT, "{ concurrency = 1 }", RATIO_AB))
    pts = [point("a", 1, "r1", 1.0), point("a", 1, "r2", 2.0, repeat=2), point("b", 1, "r1", 0.0),
           point("b", 1, "r2", 0.0, repeat=2)]
    s = scores(loaded, run(pts))["r"]
    assert_score(s, **base(
        hypothesis="r", claim="claim r", unit="ratio", kind="range", tolerance=None, ratio=True,
        targets=("a/w/1", "b/w/1"), predicted=1.25, predicted_spec=1.25, band_low=0.5, band_high=2.0,
        band_low_spec=0.5, band_high_spec=2.0, verdict="not run", verdict_spec="not run",
        reasons=(Reason(Why.NOT_CALIBRATED), Reason(Why.ZERO_DENOMINATOR, count=2),
                 Reason(Why.NOT_MEASURED, detail=TPUT)),
        point_ids=(pid("a", 1, "r1"), pid("a", 1, "r2"), pid("b", 1, "r1"), pid("b", 1, "r2")),
    ))
    assert s.notes[1] == "2 repeat(s) with a zero denominator were left out"


def test_a_side_with_no_exchangeable_point(tmp_path: Path) -> None:
    loaded = study(tmp_path, hyp("r", TPUT, "{ concurrency = 1 }", RATIO_AB))
    pts = [point("a", 1, "r1", 1.0), point("a", 1, "r2", 2.0, repeat=2), point("b", 1, "r1", 1.0)]
    plan = {"launches": [launch("La", 1, [(pid("a", 1, "r1"), 1, "why 1"), (pid("a", 1, "r2"), 2, "why 2")]),
                         launch("Lb", 1, [(pid("b", 1, "r1"), 1, "")])]}
    s = scores(loaded, run(pts, plan=plan))["r"]
    assert s.reasons == (Reason(Why.NOT_CALIBRATED), Reason(Why.NOT_EXCHANGEABLE, point=pid("a", 1, "r1"), detail="why 1"),
                         Reason(Why.NOT_EXCHANGEABLE, point=pid("a", 1, "r2"), detail="why 2"),
                         Reason(Why.NOT_MEASURED, detail=TPUT))
    assert s.notes[1] == f"{pid('a', 1, 'r1')}: left out of the interval, not exchangeable (why 1)"
    assert (s.verdict, s.interval, s.values, s.n) == ("not run", "", (), 0)


def test_unpaired_blocks_zero_pairs_and_a_linear_ratio(tmp_path: Path) -> None:
    loaded = study(tmp_path, hyp("r", TPUT, "{ concurrency = 1 }", RATIO_AB))
    a_vals, b_vals = {1: 2.0, 2: 3.0, 3: 4.0}, {1: 1.0, 2: 2.0, 3: 0.0, 4: 1.0}
    pts = ([point("a", 1, f"B{k}", v) for k, v in a_vals.items()] + [point("b", 1, f"B{k}", v) for k, v in b_vals.items()])
    plan = {"launches": [launch(f"L{arm}{k}", k, [(pid(arm, 1, f"B{k}"), 1, "")])
                         for arm, vals in (("a", a_vals), ("b", b_vals)) for k in vals]}
    s = scores(loaded, run(pts, plan=plan))["r"]
    d = [2.0, 1.5]
    half = t_quantile(0.975, 1) * 0.25
    assert s.values == tuple(d) and s.measured == pytest.approx(1.75)
    assert (s.ci_low, s.ci_high) == pytest.approx((1.75 - half, 1.75 + half))
    assert s.reasons == (Reason(Why.NOT_CALIBRATED), Reason(Why.UNPAIRED, count=1),
                         Reason(Why.ZERO_DENOMINATOR, count=1), Reason(Why.NOT_POSITIVE),
                         Reason(Why.STRADDLES, edge=0.5, unit="x", label="95% interval",
                                decide="about 20 launches per arm at this spread"),
                         Reason(Why.STRADDLES, edge=2.0, unit="x", label="95% interval",
                                decide="about 20 launches per arm at this spread"))
    assert s.interval == "paired: t on 2 block ratios (linear: a value is not positive), df 1"
    assert s.notes[1:4] == ("1 launch(es) or repeat(s) without a partner in their block were left out of the "
                            "paired interval", "1 repeat(s) with a zero denominator were left out",
                            "a ratio is not positive: its interval is on the linear scale")


def test_ratio_of_selectors_on_one_launch_pairs_repeats(tmp_path: Path) -> None:
    loaded = study(tmp_path, hyp("batch", TPUT, "{ arm = \"a\" }",
                                 "{ ratio = [{ concurrency = 4 }, { concurrency = 1 }], relation = \">\", value = 2.0 }"))
    pts = [point("a", lv, f"r{r}", v, repeat=r) for lv, vals in ((1, (100.0, 110.0)), (4, (300.0, 352.0)))
           for r, v in zip((1, 2), vals, strict=True)]
    s = scores(loaded, run(pts))["batch"]
    want = ratio_interval([Obs(p.point_id, p.summary.output_throughput, "toy/a", None, p.repeat)  # type: ignore[arg-type]
                           for p in pts if p.concurrency == 4],
                          [Obs(p.point_id, p.summary.output_throughput, "toy/a", None, p.repeat)  # type: ignore[arg-type]
                           for p in pts if p.concurrency == 1], fixed_critical)
    assert s.values == pytest.approx((3.0, 3.2)) and s.measured == pytest.approx(want.mean)
    assert (s.ci_low, s.ci_high) == pytest.approx((want.ci_low, want.ci_high))
    assert s.targets == ("a/w/4", "a/w/1") and s.unit == "ratio" and s.ratio
    assert s.reasons == (Reason(Why.NOT_CALIBRATED), ONE_CONFIRMED)  # both sides on one shared launch
    assert s.verdict == "inconclusive" and s.error is None and s.off_band == 0.0


# ---- predictions: errors, hardware, calibration, model folders --------------------------------------


def test_a_selector_error_and_a_model_without_a_folder(tmp_path: Path) -> None:
    loaded = study(tmp_path, hyp("sel", TPUT, "{ arm = \"a\", concurrency = 1 }", "{ value = \"hw.flops / 1e10\" }"))
    loaded = with_hypothesis(loaded, where=Where(arm="a"))
    model = loaded.study.model.model_copy(update={"path": None, "name": "tiny"})
    loaded = dataclasses.replace(loaded, study=loaded.study.model_copy(update={"model": model}))
    msg = "arm '' names no local model folder: expressions need a config.json"
    s = scores(loaded, run([point("a", 1, "r1", 100.0)]))["sel"]
    assert_score(s, **base(
        hypothesis="sel", claim="claim sel", targets=(), predicted=None, predicted_spec=None,
        band_low=None, band_high=None, verdict="not run", verdict_spec="not run",
        reasons=(Reason(Why.SELECTOR, detail="selector matches 2 points; narrow it by concurrency (1, 4)"),
                 Reason(Why.NOT_CALIBRATED), Reason(Why.PREDICTION, detail=msg), Reason(Why.NO_POINTS)),
    ))
    assert s.notes[0] == "selector: selector matches 2 points; narrow it by concurrency (1, 4)"


def test_a_model_that_no_longer_loads_makes_the_score_invalid(tmp_path: Path) -> None:
    """A prediction that validated but no longer evaluates (its model's config broke since) is invalid,
    with why: not inconclusive, which would keep a sequential budget adding blocks for it."""
    loaded = study(tmp_path, hyp("roof", TPUT, "{ arm = \"a\", concurrency = 1 }", "{ value = \"model.params / 1e3\" }"))
    (tmp_path / "m" / "base" / "config.json").write_text("{ not json")
    with pytest.raises(ModelError) as exc:
        load_model(tmp_path / "m" / "base")
    s = scores(loaded, run([point("a", 1, "r1", 100.0)]))["roof"]
    assert_score(s, **base(
        hypothesis="roof", claim="claim roof", targets=("a/w/1",), predicted=None, predicted_spec=None,
        band_low=None, band_high=None, values=(100.0,), n=1, measured=100.0, ci_low=100.0, ci_high=100.0,
        spread_low=100.0, spread_high=100.0, verdict="invalid", verdict_spec="invalid",
        reasons=(Reason(Why.NOT_CALIBRATED), Reason(Why.PREDICTION, detail=str(exc.value)),
                 Reason(Why.PREDICTION, detail=UNEVALUABLE)),
        point_ids=(pid("a", 1, "r1"),), interval="one value",
    ))


def test_unknown_hardware_is_not_calibrated_and_expressions_fail(tmp_path: Path) -> None:
    loaded = study(tmp_path, hyp("hw", TPUT, "{ arm = \"a\", concurrency = 1 }", "{ value = \"hw.bandwidth / 1e8\" }"))
    meta = loaded.study.study.model_copy(update={"hardware": "nope"})
    loaded = dataclasses.replace(loaded, study=loaded.study.model_copy(update={"study": meta}))
    s = scores(loaded, run([point("a", 1, "r1", 100.0)], calibrated=True, bandwidth=1e9, flops=1e12))["hw"]
    assert not s.calibrated and s.predicted is None and s.verdict == "invalid"
    assert s.reasons == (Reason(Why.NOT_CALIBRATED), Reason(Why.PREDICTION, detail="unknown hardware 'nope'"),
                         Reason(Why.PREDICTION, detail=UNEVALUABLE))
    # a number needs no hardware
    plain = with_hypothesis(loaded, predict=loaded.study.hypothesis[0].predict.model_copy(update={"value": 100.0}))
    s = scores(plain, run([point("a", 1, "r1", 100.0)]))["hw"]
    assert (s.predicted, s.verdict, s.calibrated) == (100.0, "inconclusive", False)
    assert s.reasons[-1] == Reason(Why.ONE_LAUNCH, detail="a single value, no interval; alone it would read confirmed",
                                   decide="at least 2 launches per arm, for an interval between launches")


def test_calibrated_flops_against_the_spec_sheet(tmp_path: Path) -> None:
    loaded = study(tmp_path, hyp("f", TPUT, "{ arm = \"a\", concurrency = 1 }", "{ value = \"hw.flops / 1e10\", tolerance = 0.05 }"))
    s = scores(loaded, run([point("a", 1, "r1", 150.0)], calibrated=True, bandwidth=None, flops=2e12))["f"]
    assert get_hardware("cpu").flops_bf16 == 1e12
    assert_score(s, **base(
        hypothesis="f", claim="claim f", targets=("a/w/1",), predicted=200.0, predicted_spec=100.0,
        band_low=190.0, band_high=210.0, band_low_spec=95.0, band_high_spec=105.0, values=(150.0,), n=1,
        measured=150.0, ci_low=150.0, ci_high=150.0, spread_low=150.0, spread_high=150.0, error=-0.25,
        error_spec=0.5, off_band=(150.0 - 190.0) / 190.0, off_band_spec=(150.0 - 105.0) / 105.0,
        verdict="inconclusive", verdict_spec="inconclusive", calibrated=True, point_ids=(pid("a", 1, "r1"),),
        interval="one value",  # a single value never refutes
        reasons=(Reason(Why.ONE_LAUNCH, detail="a single value, no interval; alone it would read refuted",
                        decide="at least 2 launches per arm, for an interval between launches"),),
    ))


@pytest.mark.parametrize(("value", "error", "off"), [(0.0, None, None), (1.0, 1.5, 2.5 / 1.05 - 1), (-2.0, 2.25, None)])
def test_relative_error_of_small_and_negative_predictions(tmp_path: Path, value: float, error: float | None,
                                                          off: float | None) -> None:
    loaded = study(tmp_path, hyp("z", TPUT, "{ arm = \"a\", concurrency = 1 }", f"{{ value = {value}, tolerance = 0.05 }}"))
    s = scores(loaded, run([point("a", 1, "r1", 2.5)]))["z"]
    assert s.error == (None if error is None else pytest.approx(error))
    assert s.error_spec == s.error
    assert (s.band_low, s.band_high) == pytest.approx(tuple(sorted((value * 0.95, value * 1.05))))
    if value < 0:
        assert s.off_band == pytest.approx((2.5 - value * 0.95) / abs(value * 0.95))
    else:
        assert s.off_band == (None if off is None else pytest.approx(off))
    assert s.verdict == "inconclusive" and s.reasons[-1].detail == (
        "a single value, no interval; alone it would read refuted")


def test_an_arm_model_and_kv_dtype_feed_its_expressions(tmp_path: Path) -> None:
    hyps = (hyp("pa", TPUT, "{ arm = \"a\", concurrency = 1 }", "{ value = \"model.params\" }")
            + hyp("pb", TPUT, "{ arm = \"b\", concurrency = 1 }", "{ value = \"model.params\" }")
            + hyp("kb", TPUT, "{ arm = \"b\", concurrency = 1 }", "{ value = \"model.kv_bytes_per_token\" }"))
    by_id = scores(study(tmp_path, hyps), None)
    base_shape, big_shape = load_model(tmp_path / "m" / "base"), load_model(tmp_path / "m" / "big")
    assert by_id["pa"].predicted == base_shape.params
    assert by_id["pb"].predicted == big_shape.params != base_shape.params
    assert by_id["kb"].predicted == big_shape.kv_bytes_per_token("fp8")


# ---- the pieces: model folders, dtypes, resolved predictions -----------------------------------------


def test_model_dir_per_arm(tmp_path: Path) -> None:
    loaded = study(tmp_path, "")
    assert model_dir(loaded, "a") == str(tmp_path / "m" / "base")
    assert model_dir(loaded, "b") == str(tmp_path / "m" / "big")
    assert model_dir(loaded, "nope") == str(tmp_path / "m" / "base")
    model = loaded.study.model.model_copy(update={"path": None, "name": "tiny"})
    nameonly = dataclasses.replace(loaded, study=loaded.study.model_copy(update={"model": model}))
    assert model_dir(nameonly, "a") is None
    assert model_dir(nameonly, "b") == str(tmp_path / "m" / "big")
    arms = {**loaded.study.arms, "c": loaded.study.arms["a"].model_copy(update={"model": "m/./x/../big"})}
    messy = dataclasses.replace(loaded, study=loaded.study.model_copy(update={"arms": arms}))
    assert model_dir(messy, "c") == str(tmp_path / "m" / "big")


@pytest.mark.parametrize(("study_dtype", "checkpoint", "want"), [
    ("auto", "bf16", "bf16"), ("auto", "fp16", "fp16"), ("auto", "fp32", "bf16"), ("fp16", "fp32", "fp16"),
    ("fp32", "bf16", "fp32"),
])  # fmt: skip
def test_serving_dtype(tmp_path: Path, study_dtype: str, checkpoint: str, want: str) -> None:
    loaded = study(tmp_path, "", dtype=study_dtype)
    shape = dataclasses.replace(load_model(tmp_path / "m" / "base"), dtype=checkpoint)
    assert serving_dtypes(loaded.study, "a", shape) == (want, "auto")
    assert serving_dtypes(loaded.study, "b", shape) == (want, "fp8")


@pytest.mark.parametrize(("engine", "a_kv", "b_kv"), [
    ("", "auto", "fp8"), ("kv_cache_dtype = \"fp8_e5m2\"", "fp8_e5m2", "fp8"),
    ("kv-cache-dtype = \"fp8_e4m3\"", "fp8_e4m3", "fp8"),
])  # fmt: skip
def test_kv_dtype_from_engine_and_arm(tmp_path: Path, engine: str, a_kv: str, b_kv: str) -> None:
    loaded = study(tmp_path, "", engine=engine)
    shape = load_model(tmp_path / "m" / "base")
    assert serving_dtypes(loaded.study, "a", shape) == ("bf16", a_kv)
    assert serving_dtypes(loaded.study, "b", shape) == ("bf16", b_kv)
    assert serving_dtypes(loaded.study, "nope", shape) == ("bf16", a_kv)


def _resolve(tmp: Path, predict: str, arm: str = "a", **kw: Any) -> Resolved:
    loaded = study(tmp, hyp("x", TPUT, f"{{ arm = \"{arm}\", concurrency = 1 }}", predict), **kw)
    return resolve_prediction(loaded, loaded.study.hypothesis[0], arm, get_hardware("cpu"))


@pytest.mark.parametrize(("predict", "want"), [
    ("{ range = [\"hw.flops / 1e10\", \"hw.bandwidth / 1e8\"] }", Resolved(150.0, 100.0, 200.0)),
    ("{ range = [\"hw.bandwidth / 1e8\", \"hw.flops / 1e10\"] }", Resolved(150.0, 100.0, 200.0)),
    ("{ range = [3, 1] }", Resolved(2.0, 1.0, 3.0)),
    ("{ relation = \">\", value = 2 }", Resolved(2.0, 2.0, None)),
    ("{ relation = \">=\", value = \"hw.flops / 1e12\" }", Resolved(1.0, 1.0, None)),
    ("{ relation = \"<\", value = 2 }", Resolved(2.0, None, 2.0)),
    ("{ relation = \"<=\", value = 2 }", Resolved(2.0, None, 2.0)),
    ("{ value = -10, tolerance = 0.1 }", Resolved(-10.0, -11.0, -9.0)),
    ("{ value = 10 }", Resolved(10.0, 9.5, 10.5)),
])  # fmt: skip
def test_resolve_prediction_kinds(tmp_path: Path, predict: str, want: Resolved) -> None:
    got = _resolve(tmp_path, predict)
    assert (got.predicted, got.band_low, got.band_high) == pytest.approx(
        (want.predicted, want.band_low, want.band_high))
    assert [x is None for x in (got.band_low, got.band_high)] == [x is None for x in (want.band_low, want.band_high)]


def test_resolve_prediction_uses_the_arm_and_the_serving_dtypes(tmp_path: Path) -> None:
    w32 = _resolve(tmp_path, "{ value = \"model.weight_bytes\" }", dtype="fp32")
    params = load_model(tmp_path / "m" / "base").params
    assert w32.predicted == 4 * params
    kv_b = _resolve(tmp_path, "{ value = \"model.kv_bytes_per_token\" }", arm="b")
    assert kv_b.predicted == load_model(tmp_path / "m" / "big").kv_bytes_per_token("fp8")
    loaded = study(tmp_path, hyp("x", TPUT, "{ arm = \"a\", concurrency = 1 }", "{ value = \"hw.flops\" }"))
    with pytest.raises(Exception, match=r"^unknown hardware 'cpu'$"):
        resolve_prediction(loaded, loaded.study.hypothesis[0], "a", None)
    model = loaded.study.model.model_copy(update={"path": None, "name": "tiny"})
    nameonly = dataclasses.replace(loaded, study=loaded.study.model_copy(update={"model": model}))
    with pytest.raises(ModelError, match=r"^arm 'a' names no local model folder: expressions need a config\.json$"):
        resolve_prediction(nameonly, nameonly.study.hypothesis[0], "a", get_hardware("cpu"))


def test_a_ratio_read_at_a_sequential_look(tmp_path: Path) -> None:
    loaded = study(tmp_path, hyp("kv", "kv_capacity_tokens", "{}", "{ ratio = [\"b\", \"a\"], range = [1.0, 2.0] }"))
    servers = [server("toy/b/1", "b", 1500), server("toy/b/2", "b", 1760), server("toy/a/1", "a", 1000),
               server("toy/a/2", "a", 1100)]
    plan = {"launches": [launch(f"L{arm}{b}", b, server_ids=[f"toy/{arm}/{b}"]) for arm in "ab" for b in (1, 2)],
            "design": {"launches": {"a": 3}, "budget": {"blocks": 4}}}
    s = scores(loaded, run(servers=servers, plan=plan))["kv"]
    logs = [math.log(1.5), math.log(1.6)]
    mean = sum(logs) / 2
    half = t_quantile(1 - 0.01 / 2, 1) * abs(logs[1] - logs[0]) / 2  # an early look: alpha 0.01
    assert (s.ci_low, s.ci_high) == pytest.approx((math.exp(mean - half), math.exp(mean + half)))


def test_a_hypothesis_measured_in_fewer_blocks_than_the_run_says_the_look_it_is_read_at(tmp_path: Path) -> None:
    """Under a budget, a hypothesis decided at block 3 is not measured in block 4: its interval is block 3's
    look (alpha 0.01 / 1 at the first look of a four-block budget), and the score says so; one measured in
    every block of the run is read at the run's look and says nothing more."""
    loaded = study(tmp_path, hyp("c1", TPUT, "{ arm = \"a\", concurrency = 1 }", "{ relation = \">\", value = 90.0 }")
                   + hyp("c4", TPUT, "{ arm = \"a\", concurrency = 4 }", "{ relation = \">\", value = 90.0 }"))
    c1 = {1: 100.0, 2: 102.0, 3: 104.0}
    c4 = {1: 200.0, 2: 204.0, 3: 202.0, 4: 206.0}
    pts = ([point("a", 1, f"L{b}", v) for b, v in c1.items()] + [point("a", 4, f"L{b}", v) for b, v in c4.items()])
    plan = {"launches": [launch(f"L{b}", b, [(pid("a", 1, f"L{b}"), 1, "")] * (b in c1) + [(pid("a", 4, f"L{b}"), 1, "")])
                         for b in (1, 2, 3, 4)],
            "design": {"launches": {"a": 3}, "budget": {"blocks": 4}}}
    got = scores(loaded, run(pts, plan=plan))
    early = [r for r in got["c1"].reasons if r.why is Why.EARLY_LOOK]
    assert early == [Reason(Why.EARLY_LOOK, count=3, detail="99% interval, look 3 of 4")]
    assert early[0].text == ("its interval uses 3 of the run's blocks (a decided hypothesis is not measured again; a "
                             "block without both sides of a pair is left out of it): read at that look, the 99% "
                             "interval, look 3 of 4")
    assert (got["c1"].look, got["c1"].interval_label) == ((3, 4), "99% interval, look 3 of 4")  # the first look
    assert (got["c4"].look, got["c4"].interval_label) == ((4, 4), "96% interval, look 4 of 4")  # the last
    half = t_quantile(1 - 0.01 / 2, 2) * 2.0 / math.sqrt(3)
    assert (got["c1"].ci_low, got["c1"].ci_high) == pytest.approx((102.0 - half, 102.0 + half))
    assert not [r for r in got["c4"].reasons if r.why is Why.EARLY_LOOK]

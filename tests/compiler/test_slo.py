"""[slo] and [load] search: accepted and rejected with file:line:key, what needs an [slo] or a search, the
plan's search steps (ids, estimate, bytes of a plan without them unchanged)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from compiler.load import check_file, load_study
from compiler.plan import Plan
from compiler.plan_compile import compile_study
from compiler.slo import Slo
from studyc.cli import main
from tests.variants import study_variant

ROOT = Path(__file__).resolve().parents[2]
CAPACITY = ROOT / "tests/runner/studies/capacity.toml"


def _variant(tmp_path: Path, *edits: tuple[str, str]) -> Path:
    return study_variant(tmp_path, *edits, source=CAPACITY)


def _messages(path: Path) -> list[str]:
    _, problems = check_file(path)
    return [f"{p.line}: {p.path}: {p.message}" for p in problems]


def test_the_capacity_study_validates(tmp_path: Path) -> None:
    assert _messages(_variant(tmp_path)) == []


def test_an_slo_on_an_unknown_metric_names_file_line_and_key(tmp_path: Path) -> None:
    path = _variant(tmp_path, ("ttft_ms = 400", "ttft_p95_ms = 400"))
    result = CliRunner().invoke(main, ["validate", str(path)])
    assert result.exit_code == 2
    assert f"{path}:41: slo.ttft_p95_ms:" in result.output and "Traceback" not in result.output


@pytest.mark.parametrize(("edit", "message"), [
    (("ttft_ms = 400", "ttft_ms = 0"), "41: slo.ttft_ms: Input should be greater than 0"),
    (("attainment = 0.9", "attainment = 1.01"), "42: slo.attainment: Input should be less than or equal to 1"),
    (("attainment = 0.9", "attainment = 0"), "42: slo.attainment: Input should be greater than 0"),
    (("ttft_ms = 400", "itl_ms = -1"), "41: slo.itl_ms: Input should be greater than 0"),
])
def test_bad_slo_values(tmp_path: Path, edit: tuple[str, str], message: str) -> None:
    found = _messages(_variant(tmp_path, edit))
    key, said = message.split(" Input ")
    assert len(found) == 1 and found[0].startswith(key) and found[0].endswith(said), found


def test_attainment_of_one_is_allowed(tmp_path: Path) -> None:
    assert _messages(_variant(tmp_path, ("attainment = 0.9", "attainment = 1"))) == []


def test_an_slo_without_an_objective_is_refused(tmp_path: Path) -> None:
    found = _messages(_variant(tmp_path, ("ttft_ms = 400\n", "")))
    assert len(found) == 1 and "40: slo: " in found[0] and "at least one objective" in found[0]


@pytest.mark.parametrize(("search", "said"), [
    ("{ concurrency = [8, 8], probes = 4 }", "low end (8) must be below its high end (8)"),
    ("{ concurrency = [9, 8], probes = 4 }", "low end (9) must be below its high end (8)"),
    ("{ concurrency = [1, 8], rate = [1.0, 2.0] }", "exactly one of"),
    ("{ probes = 4 }", "exactly one of"),
    ("{ concurrency = [1, 8], probes = 1 }", "probes: Input should be greater than or equal to 2"),
    ("{ concurrency = [1, 8], probes = 13 }", "probes: Input should be less than or equal to 12"),
    ("{ concurrency = [0, 8] }", "concurrency[0]: Input should be greater than 0"),
    ("{ rate = [1.0, 4.0], waves = 3 }", "an open-loop `rate` search has no waves; give load.requests instead"),
    ("{ concurrency = [1, 8], waves = 1 }", "waves: Input should be greater than or equal to 2"),
    ("{ concurrency = [1, 8], waves = 101 }", "waves: Input should be less than or equal to 100"),
    ("{ concurrency = [1, 8], waves = 3.0 }", "waves: Input should be a valid integer"),
])
def test_bad_searches(tmp_path: Path, search: str, said: str) -> None:
    found = _messages(_variant(tmp_path, ("{ concurrency = [1, 8], probes = 4 }", search)))
    assert len(found) == 1 and found[0].startswith("35: load.search") and said.replace("Input s", "s") in \
        found[0].replace("Input s", "s"), found


def test_probes_at_the_bounds_are_allowed(tmp_path: Path) -> None:
    for probes in (2, 12):
        assert _messages(_variant(tmp_path, ("probes = 4", f"probes = {probes}"))) == []


def test_a_search_and_a_ladder_are_exclusive(tmp_path: Path) -> None:
    found = _messages(_variant(tmp_path, ("requests = 16", "requests = 16\nconcurrency = [1, 2]")))
    assert len(found) == 1 and "exactly one of `concurrency`" in found[0] and "not concurrency and search" in found[0]


def test_a_search_needs_an_slo(tmp_path: Path) -> None:
    path = _variant(tmp_path, ("[slo]\nttft_ms = 400\nattainment = 0.9\n", ""))
    assert _messages(path) == [
        "35: load.search: a capacity search needs an [slo] table: a probe holds when its requests meet it",
        "44: hypothesis[0].metric: capacity is the highest load whose slo_attainment holds [slo].attainment: "
        "add an [slo] table",
    ]


@pytest.mark.parametrize("metric", ["goodput", "slo_attainment"])
def test_slo_metrics_need_an_slo(tmp_path: Path, metric: str) -> None:
    text = (ROOT / "studies/quickstart.toml").read_text().replace(
        'path = "../models/tiny-qwen3"', f'path = "{ROOT / "models/tiny-qwen3"}"')
    text = text.replace('metric = "output_throughput"', f'metric = "{metric}"', 1)
    path = tmp_path / "q.toml"
    path.write_text(text)
    _, problems = check_file(path)
    assert [p.path for p in problems] == ["hypothesis[0].metric"] and "add an [slo] table" in problems[0].message
    path.write_text(text + "\n[slo]\nttft_ms = 1000\n")
    assert check_file(path)[1] == []


def test_capacity_needs_a_search_and_a_search_has_no_points(tmp_path: Path) -> None:
    text = (ROOT / "studies/quickstart.toml").read_text().replace(
        'path = "../models/tiny-qwen3"', f'path = "{ROOT / "models/tiny-qwen3"}"')
    path = tmp_path / "q.toml"
    path.write_text(text.replace('metric = "output_throughput"', 'metric = "capacity"', 1) + "\n[slo]\ne2el_ms = 9\n")
    messages = [p.message for p in check_file(path)[1]]
    assert messages == ["capacity needs a capacity search: give load.search instead of a ladder"]
    path = _variant(tmp_path, ('metric = "capacity"', 'metric = "ttft_p95_s"'))
    assert _messages(path) == ["47: hypothesis[0].metric: a capacity search study has no fixed load points: "
                               "predict `capacity` or a server metric"]


def test_a_search_selector_takes_no_level(tmp_path: Path) -> None:
    path = _variant(tmp_path, ('metric = "capacity"', 'metric = "capacity"\nwhere = { concurrency = 4 }'))
    assert _messages(path) == ["48: hypothesis[0].where.concurrency: a capacity search has no ladder to select a "
                               "level from: leave the level out"]


def test_a_search_needs_one_server_per_launch(tmp_path: Path) -> None:
    path = _variant(tmp_path, ("launches = 1", 'launches = 1\nserver = "per-point"'))
    assert _messages(path) == ['39: load.server: a capacity search probes one server launch: use server = "per-arm"']


def test_slo_limits_and_the_bench_equivalent() -> None:
    slo = Slo(ttft_ms=1000, itl_ms=50, e2el_ms=2500)
    assert slo.limits_s() == {"ttft": 1.0, "itl": 0.05, "e2el": 2.5}
    assert slo.bench_goodput() == "ttft:1000 e2el:2500"
    assert Slo(tpot_ms=20).bench_goodput() == "tpot:20" and Slo(tpot_ms=20).attainment == 0.95


def test_the_plan_holds_one_search_per_launch_and_workload(tmp_path: Path) -> None:
    path = _variant(tmp_path, ("launches = 1", "launches = 2"))
    plan = compile_study(load_study(path))
    assert plan.points == [] and plan.slo is not None and plan.slo.ttft_ms == 400
    searches = [q for launch in plan.launches for q in launch.searches]
    assert sorted(q.id for q in searches) == [f"capacity/{a}/L{k}/w/search" for a in ("large", "small") for k in (1, 2)]
    q = searches[0]
    assert (q.over, q.lo, q.hi, q.probes, q.attainment) == ("concurrency", 1.0, 8.0, 4, 0.9)
    assert q.template.concurrency == 8 and q.template.id == f"{q.id}/c8/r1" and q.template.requests == 16
    # hi, lo and two probes at the middle: with a fixed request count the lower probes run more waves
    assert 4 * q.template.estimated_s < q.estimated_s < 4 * 16 * q.template.estimated_s
    launch_s = plan.launches[0].estimated_start_s + q.estimated_s
    assert plan.estimated_s == pytest.approx(4 * launch_s, abs=0.2)
    hyp = plan.hypotheses[0]
    assert hyp.level == "search" and len(hyp.numerator.points) == 2 and hyp.numerator.points[0].endswith("/search")
    assert json.loads(plan.to_json())["slo"]["attainment"] == 0.9


def test_a_plan_without_slo_or_search_keeps_its_bytes() -> None:
    text = compile_study(load_study(ROOT / "studies/quickstart.toml")).to_json()
    assert '"slo"' not in text and '"searches"' not in text


def test_plan_shows_the_search_and_its_estimate(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["plan", str(_variant(tmp_path))])
    assert result.exit_code == 0, result.output
    assert "2 capacity search(es) of up to 8 probe point(s)" in result.output
    assert "capacity/large/w/search" in result.output and "up to 4 probes (hi, lo, then bisection)" in result.output
    assert "capacity ratio of 1 capacity search(es) over 1 capacity search(es)" in result.output


def test_a_search_whose_top_is_one_wave_is_refused(tmp_path: Path) -> None:
    assert _messages(_variant(tmp_path, ("requests = 16", "requests = 8"))) == [
        "36: load.requests: 8 requests at the search's top concurrency 8 is one wave or less: every probe at hi "
        "fails the steady_state check, which stops the search unresolved at its first probe. Fix: "
        "load.search.waves = 3 (every probe sends 3 waves of its own concurrency), or load.requests >= 24 "
        "(3 waves at 8)"]
    loaded, problems = check_file(_variant(tmp_path, ("requests = 16", "requests = 9")))
    assert problems == [] and loaded is not None and loaded.warnings == ()
    burst = _variant(tmp_path, ("requests = 16", "requests = 8\nburst = true"))  # one wave on purpose
    assert _messages(burst) == []


FOUR_TURNS = ("output_len = 16\n", "output_len = 16\nturns = 4\n")


def test_a_multi_turn_search_counts_its_top_wave_in_conversations(tmp_path: Path) -> None:
    # 16 requests are 4 four-turn conversations: under one wave at concurrency 8 (the kv-capacity-slo defect)
    path = _variant(tmp_path, FOUR_TURNS)
    result = CliRunner().invoke(main, ["validate", str(path)])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert f"{path}:37: load.requests: 16 requests (4 conversations of 4 turns) at the search's top concurrency 8 " \
           "is one wave or less" in result.output
    assert "load.search.waves = 3" in result.output and "load.requests >= 96 (3 waves at 8 of 4-turn " \
           "conversations)" in result.output
    assert _messages(_variant(tmp_path, FOUR_TURNS, ("requests = 16", "requests = 32"))) != []  # 8: one wave
    assert _messages(_variant(tmp_path, FOUR_TURNS, ("requests = 16", "requests = 36"))) == []  # 9 conversations


def test_waves_size_every_probe_and_clear_the_one_wave_error(tmp_path: Path) -> None:
    waves = ("probes = 4 }\nrequests = 16", "probes = 4, waves = 3 }")
    path = _variant(tmp_path, FOUR_TURNS, waves)
    assert _messages(path) == []
    q = compile_study(load_study(path)).launches[0].searches[0]
    assert (q.waves, q.template.concurrency, q.template.requests) == (3, 8, 3 * 8 * 4)
    # with waves a lower probe sends fewer requests (3 waves of its own level), so costs less than hi
    assert 2 * q.template.estimated_s < q.estimated_s < 4 * q.template.estimated_s
    single = compile_study(load_study(_variant(tmp_path, waves))).launches[0].searches[0]
    assert (single.waves, single.template.requests) == (3, 24)


def test_waves_and_requests_are_exclusive(tmp_path: Path) -> None:
    path = _variant(tmp_path, ("probes = 4 }", "probes = 4, waves = 3 }"))
    assert _messages(path) == ["34: load: give one of load.requests or load.search.waves: with waves "
                               "every probe sends waves x its concurrency"]


def test_a_search_without_waves_keeps_its_plan_bytes(tmp_path: Path) -> None:
    text = compile_study(load_study(_variant(tmp_path))).to_json()
    assert '"searches"' in text and '"waves"' not in text
    stored = Plan.from_stored(text)  # a plan stored before waves existed reads back without them
    assert stored is not None and stored.to_json() == text and stored.launches[0].searches[0].waves is None


def test_plan_says_how_many_waves_a_probe(tmp_path: Path) -> None:
    plain = CliRunner().invoke(main, ["plan", str(_variant(tmp_path))])
    assert plain.exit_code == 0 and "waves a probe" not in plain.output
    path = _variant(tmp_path, ("probes = 4 }\nrequests = 16", "probes = 4, waves = 3 }"))
    result = CliRunner().invoke(main, ["plan", str(path)])
    assert result.exit_code == 0, result.output
    assert "holds at slo_attainment >= 0.9, 3 waves a probe" in result.output


def test_the_bench_equivalent_carries_the_slo_as_goodput(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["plan", str(_variant(tmp_path, ("ttft_ms = 400", "ttft_ms = 400\ntpot_ms = 25\n"
                                                                       "itl_ms = 9"))), "--bench"])
    assert result.exit_code == 0, result.output
    assert "--max-concurrency 8 --percentile-metrics ttft,tpot,itl,e2el --metric-percentiles 50,95,99 " \
           "--goodput ttft:400 tpot:25\n" in result.output
    plain = CliRunner().invoke(main, ["plan", str(ROOT / "studies/quickstart.toml"), "--bench"])
    assert plain.exit_code == 0 and "--goodput" not in plain.output


def test_progress_counts_the_searches_most_probes_and_their_estimate(tmp_path: Path) -> None:
    from studyc.progress import most_points, remaining_s

    plan = compile_study(load_study(_variant(tmp_path)))
    assert most_points(plan) == 2 * 4
    assert remaining_s(plan, set(), set(), 1.0) == pytest.approx(plan.estimated_s, abs=0.2)
    first = plan.launches[0]
    assert remaining_s(plan, set(), {first.id}, 1.0) == pytest.approx(
        plan.estimated_s - first.estimated_start_s - first.searches[0].estimated_s, abs=0.2)

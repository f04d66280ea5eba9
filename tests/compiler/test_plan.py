"""The plan: pure (same file, same bytes), golden JSON, ordering and ids as documented."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from compiler.load import load_study
from compiler.plan_compile import cli_args, compile_study
from studyc.cli import main
from tests.golden import check_golden

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _at_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)


@pytest.mark.parametrize("name", ["quickstart", "fp8_kv"])
def test_plan_golden_json(name: str) -> None:
    result = CliRunner().invoke(main, ["plan", f"studies/{name}.toml", "--json"])
    assert result.exit_code == 0, result.output
    # Plan paths are absolute; the golden file holds them relative to the checkout.
    check_golden(ROOT / "tests/compiler/golden" / f"plan_{name}.json", result.stdout.replace(f"{ROOT}/", ""))


def test_plan_is_pure_and_stable(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    a = compile_study(load_study("studies/fp8_kv.toml")).to_json()
    b = compile_study(load_study("studies/fp8_kv.toml")).to_json()
    assert a == b
    # The same file named from another working directory gives the same plan, byte for byte.
    monkeypatch.chdir(ROOT / "studies")
    assert compile_study(load_study("fp8_kv.toml")).to_json() == a
    monkeypatch.chdir(tmp_path)
    assert compile_study(load_study(ROOT / "studies/fp8_kv.toml")).to_json() == a
    assert f'"serve",\n        "{ROOT}/models/qwen3-8b"' in a


def test_an_arm_with_its_own_model_serves_it_under_its_own_name() -> None:
    plan = compile_study(load_study("studies/decode_roofline.toml"))
    big = next(s for s in plan.launches if s.arm == "qwen3-8b")
    small = next(s for s in plan.launches if s.arm == "qwen3-0-6b")
    assert big.served_model_name == "Qwen/Qwen3-8B"
    assert small.argv[1].endswith("models/qwen3-0.6b")
    assert small.served_model_name == "qwen3-0.6b"
    assert small.argv[small.argv.index("--served-model-name") + 1] == "qwen3-0.6b"


def test_hypotheses_resolve_to_point_ids_of_every_launch() -> None:
    plan = compile_study(load_study("studies/quickstart.toml"))
    hyps = {h.id: h for h in plan.hypotheses}
    assert list(hyps) == ["batching-helps", "cold-means-cold", "kept-cache-hits", "fast-first-token"]
    ratio = hyps["batching-helps"]
    assert ratio.numerator.points == tuple(f"quickstart/cold/L{n}/short/c4/r1" for n in (1, 2, 3))
    assert ratio.denominator is not None
    assert ratio.denominator.points == tuple(f"quickstart/cold/L{n}/short/c1/r1" for n in (1, 2, 3))
    assert ratio.points == ratio.numerator.points + ratio.denominator.points
    warm = hyps["kept-cache-hits"]
    assert warm.denominator is None and warm.numerator.concurrency == 4
    assert warm.points == tuple(f"quickstart/warm/L{n}/short/c4/r1" for n in (1, 2, 3))
    ids = {p.id for p in plan.points}
    assert all(set(h.points) <= ids for h in plan.hypotheses)


def test_server_metric_hypotheses_name_servers_not_points() -> None:
    plan = compile_study(load_study("studies/fp8_kv.toml"))
    capacity = next(h for h in plan.hypotheses if h.metric == "kv_capacity_tokens")
    assert capacity.level == "server" and capacity.points == ()
    # three required blocks and the budget's nine: every block's server
    assert capacity.numerator.servers == tuple(f"fp8-kv/fp8/L{n}" for n in range(1, 13))
    assert capacity.denominator is not None
    assert capacity.denominator.servers == tuple(f"fp8-kv/bf16/L{n}" for n in range(1, 13))


def test_plan_json_lists_hypotheses_with_their_points() -> None:
    result = CliRunner().invoke(main, ["plan", "studies/fp8_kv.toml", "--format", "json"])
    plan = json.loads(result.stdout)
    first = plan["hypotheses"][0]
    assert set(first) >= {"id", "metric", "claim", "prediction", "points", "numerator", "denominator"}
    assert first["numerator"]["points"] and first["denominator"]["points"]


def test_launches_outer_repeats_interleaved() -> None:
    plan = compile_study(load_study("studies/fp8_kv.toml"))
    # Three launches per arm and a budget of twelve blocks: twelve blocks, each with one launch of every
    # arm, in a seeded order; the first three required.
    assert [sorted(b.launches) for b in plan.design.blocks] == [
        [f"fp8-kv/bf16/L{n}", f"fp8-kv/fp8/L{n}"] for n in range(1, 13)]
    assert [s.required for s in plan.launches] == [True] * 6 + [False] * 18
    assert [s.id for s in plan.launches] == [i for b in plan.design.blocks for i in b.launches]
    bf16 = next(s for s in plan.launches if s.arm == "bf16")
    ids = [p.id for p in bf16.points]
    assert ids[:3] == ["fp8-kv/bf16/L1/decode/c1/r1", "fp8-kv/bf16/L1/decode/c8/r1", "fp8-kv/bf16/L1/decode/c32/r1"]
    assert len(ids) == len(set(ids)) == 2 * 4 * 1
    # fingerprints differ between launches and arms but the prompts are the same seeded set
    fps = {p.fingerprint for s in plan.launches for p in s.points}
    assert len(fps) == 16 * 12


def test_argv_resolved() -> None:
    plan = compile_study(load_study("studies/fp8_kv.toml"))
    fp8 = next(s for s in plan.launches if s.arm == "fp8")
    assert fp8.argv[:2] == ("serve", str(ROOT / "models/qwen3-8b"))
    assert "--kv-cache-dtype" in fp8.argv and fp8.argv[fp8.argv.index("--kv-cache-dtype") + 1] == "fp8"
    assert "--enable-prefix-caching" in fp8.argv
    assert fp8.kv_cache_dtype == "fp8"


def test_cli_args_forms() -> None:
    assert cli_args({"enforce_eager": True, "enable_prefix_caching": False, "max_num_seqs": 8,
                     "compilation_config": {"level": 0}}) == [
        "--enforce-eager", "--no-enable-prefix-caching", "--max-num-seqs", "8", "--compilation-config", '{"level":0}',
    ]


def test_plan_table_mentions_every_point() -> None:
    result = CliRunner().invoke(main, ["plan", "studies/quickstart.toml"])
    assert result.exit_code == 0
    plan = json.loads(CliRunner().invoke(main, ["plan", "studies/quickstart.toml", "--json"]).stdout)
    for launch in plan["launches"]:
        for point in launch["points"]:
            assert point["id"] in result.output
    assert "estimated" in result.output


def test_schema_is_json_schema() -> None:
    result = CliRunner().invoke(main, ["schema"])
    schema = json.loads(result.output)
    assert schema["title"] == "Study"
    assert "hypothesis" in schema["properties"]
    assert schema["additionalProperties"] is False


def _variant(tmp_path: Path, old: str, new: str) -> Path:
    text = (ROOT / "studies/quickstart.toml").read_text().replace('path = "../models/tiny-qwen3"',
                                                                   f'path = "{ROOT / "models/tiny-qwen3"}"')
    assert old in text
    path = tmp_path / "variant.toml"
    path.write_text(text.replace(old, new))
    return path


def test_server_per_point_starts_a_fresh_server_for_every_point(tmp_path: Path) -> None:
    plan = compile_study(load_study(_variant(tmp_path, 'cache = "reset"', 'cache = "reset"\nserver = "per-point"')))
    assert len(plan.launches) == len(plan.points) == 12
    assert all(len(s.points) == 1 for s in plan.launches)
    assert plan.launches[0].id == "quickstart/cold/L1/short/c1/r1"


def test_rate_ladder_compiles_open_loop_points(tmp_path: Path) -> None:
    path = _variant(tmp_path, "concurrency = [1, 4]", 'rate = [2.5, 10]\narrival = "gamma"\nburstiness = 0.5')
    path.write_text(path.read_text().replace("concurrency = 4", "rate = 10").replace("concurrency = 1", "rate = 2.5"))
    plan = compile_study(load_study(path))
    point = plan.launches[0].points[1]
    assert point.id == "quickstart/cold/L1/short/rate10/r1"
    assert point.concurrency is None and point.rate_rps == 10.0 and point.arrival == "gamma"


def test_run_dry_run_prints_every_plan_and_validates_all_first() -> None:
    result = CliRunner().invoke(main, ["run", "studies/quickstart.toml", "studies/fp8_kv.toml", "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "plan quickstart:" in result.output and "plan fp8-kv:" in result.output
    # A bad file anywhere in the list stops the run before any server starts.
    bad = CliRunner().invoke(main, ["run", "studies/quickstart.toml", "tests/compiler/bad/unknown_key.toml"])
    assert bad.exit_code == 2
    assert "load.concurency: unknown key" in bad.output and "server" not in bad.output


def test_engine_settings_read_once_from_the_argv() -> None:
    """A launch's typed engine settings: what the step-time model and the report read instead of the argv."""
    from compiler.plan import Engine
    from compiler.stepcost import EngineShape

    eager = Engine.from_argv(["serve", "/x/models/m", "--served-model-name", "m", "--enforce-eager",
                              "--max-num-batched-tokens", "2048", "--max-num-seqs=64", "--dtype", "float16",
                              "--kv-cache-dtype", "auto", "--enable-prefix-caching", "--no-enable-chunked-prefill"])
    assert (eager.max_num_batched_tokens, eager.max_num_seqs, eager.dtype) == (2048, 64, "float16")
    assert eager.enforce_eager and eager.prefix_caching and not eager.chunked_prefill
    assert eager.configuration == ("serve", "m", "--enforce-eager", "--max-num-batched-tokens", "2048",
                                   "--max-num-seqs=64", "--dtype", "float16", "--no-enable-chunked-prefill")
    plain = Engine.from_argv(["serve", "m", "--no-enable-prefix-caching", "--kv-cache-dtype", "fp8"])
    assert (plain.max_num_batched_tokens, plain.max_num_seqs, plain.dtype) == (None, None, None)
    assert not plain.enforce_eager and not plain.prefix_caching and plain.chunked_prefill
    assert plain.configuration == ("serve", "m", "--no-enable-prefix-caching", "--kv-cache-dtype", "fp8")

    from report.ledger.ledger import engine_shape

    launch = compile_study(load_study("studies/quickstart.toml")).launches[0]
    assert engine_shape(launch) == EngineShape(max_num_seqs=16, enforce_eager=True)
    assert engine_shape(launch.model_copy(update={"engine": eager, "kv_cache_dtype": "fp8"})) == EngineShape(
        budget_tokens=2048, max_num_seqs=64, dtype="float16", kv_cache_dtype="fp8", enforce_eager=True,
        chunked_prefill=False)


def test_a_stored_plan_without_engine_settings_reads_them_from_its_argv() -> None:
    from compiler.plan import Plan

    plan = compile_study(load_study("studies/quickstart.toml"))
    stored = json.loads(plan.to_json())
    for launch in stored["launches"]:
        del launch["engine"]
    assert Plan.from_stored(json.dumps(stored)) == plan
    assert Plan.from_stored(plan.to_json()) == plan
    assert Plan.from_stored(None) is None and Plan.from_stored('{"schema_version": 2}') is None

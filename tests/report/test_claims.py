"""A claim against the hypotheses that name it: every condition it states compared with the plan and run,
demoting ones (GPU, model, lengths, dataset, cache, load, deployment, engine options) apart from listed ones
(engine version, driver, dummy weights, repeats); the status; the CLI's JSON; the site's tables."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from compiler.claims import Catalog, Conditions, load_catalog
from compiler.load import load_study
from report.claims import claim_rows, counts, dataset_kind
from report.results import RunData
from report.scoring.context import build_context
from report.scoring.score_model import Score
from runner.store.records import RunRecord
from studyc.cli import main
from tests.report.helpers import REPO, TINY_MODEL

STUDY = f'''
[study]
id = "bench"
title = "Bench"
question = "Does it?"
hardware = "h100-sxm"

[model]
path = "{TINY_MODEL}"
name = "tiny"

[engine]
max_model_len = 2048

[arms.graphs]
[arms.eager]
enforce_eager = true
[arms.kept]
cache = "keep"
max_num_seqs = 64

[workloads.fixed]
input_len = 128
output_len = 1024
[workloads.drawn]
input_len = 128
output_len = {{ dist = "uniform", min = 8, max = 96 }}
[workloads.shared]
input_len = 128
output_len = 1024
prefix_len = 64

[load]
concurrency = [1, 4]
requests = 8
warmup = 2
launches = 2
repeats = 1

[[hypothesis]]
id = "c1"
claim = "c1"
metric = "output_throughput"
where = {{ arm = "graphs", workload = "fixed", concurrency = 1 }}
predict = {{ value = 100 }}
claims = ["b-c1"]

[[hypothesis]]
id = "eager-ratio"
claim = "eager halves"
metric = "output_throughput"
where = {{ workload = "fixed", concurrency = 4 }}
predict = {{ ratio = ["eager", "graphs"], value = 0.5 }}
claims = ["b-eager"]

[[hypothesis]]
id = "drawn"
claim = "drawn tail"
metric = "itl_p95_s"
where = {{ arm = "graphs", workload = "drawn", concurrency = 4 }}
predict = {{ value = 0.01 }}
claims = ["b-drawn"]

[[hypothesis]]
id = "kept"
claim = "kept vs reset"
metric = "output_throughput"
where = {{ workload = "shared", concurrency = 4 }}
predict = {{ ratio = ["kept", "graphs"], relation = ">", value = 1 }}
claims = ["b-kept"]

[[hypothesis]]
id = "capacity"
claim = "kv capacity"
metric = "kv_capacity_tokens"
where = {{ arm = "graphs" }}
predict = {{ relation = ">", value = 1 }}
claims = ["b-capacity"]
'''

SOURCE = '''
[document]
id = "bench-doc"
title = "Bench doc"

[conditions]
gpu = "h100-sxm"
gpus = 1
replicas = 1
vllm = "0.27.1"
driver = "580.1"
model = ["tiny-qwen3"]
input_len = 128
output_len = 1024
dataset = "random"
cache = "reset"
repeats = 3

[[claim]]
id = "b-c1"
text = "c1"
conditions = { concurrency = [1] }

[[claim]]
id = "b-eager"
text = "eager"
conditions = { concurrency = [64] }

[[claim]]
id = "b-drawn"
text = "drawn"
conditions = { output_len = { max = 96 }, concurrency = [4, 400] }

[[claim]]
id = "b-kept"
text = "kept"
conditions = { dataset = "shared-prefix", cache = ["keep", "reset"], engine = { max_num_seqs = 64 } }

[[claim]]
id = "b-capacity"
text = "capacity"
conditions = { gpu = "h200", concurrency = [128], input_len = 4096 }

[[claim]]
id = "b-untested"
text = "eight GPUs"
untested = "needs 8 GPUs"

[[claim]]
id = "b-forgotten"
text = "nobody tests this"
'''


@pytest.fixture()
def bench(tmp_path: Path) -> tuple[Catalog, Path]:
    (tmp_path / "sources").mkdir()
    (tmp_path / "sources" / "bench-doc.toml").write_text(SOURCE)
    path = tmp_path / "bench.toml"
    path.write_text(STUDY)
    return load_catalog(tmp_path / "sources"), path


def _run(gpu: str = "NVIDIA H100 80GB HBM3", vllm: str = "0.26.0", driver: str = "580.2") -> RunData:
    record = RunRecord(run_id="r1", study_id="bench", status="complete", gpu_name=gpu, vllm_version=vllm,
                       driver_version=driver)
    return RunData(db=Path("x.duckdb"), run=record, servers=(), points=(), checks=(), telemetry=())


def _rows(catalog: Catalog, path: Path, data: RunData | None, verdict: str = "confirmed",
          measured: bool = True) -> dict[str, dict[str, object]]:
    ctx = build_context(load_study(path), data)
    scores = {"bench": [_score(h.id, verdict) for h in ctx.study.hypothesis]}
    return {r.claim: r.json() for r in claim_rows(catalog, [ctx], scores, measured=measured)}


@dataclass(frozen=True)
class _Scored:
    """What report.claims reads of a Score: its hypothesis and verdict."""

    hypothesis: str
    verdict: str


def _score(hypothesis: str, verdict: str) -> Score:
    return _Scored(hypothesis, verdict)  # type: ignore[return-value]


def test_a_run_with_every_stated_condition_is_faithful_and_lists_what_cannot_match(bench: tuple[Catalog, Path]) -> None:
    rows = _rows(*bench, _run())
    c1 = rows["b-c1"]
    assert c1["status"] == "faithful" and c1["reason"] == ""
    assert c1["differs"] == [
        "weights: dummy (claim: real weights; listed, not demoting)",
        "vllm: 0.26.0 (claim: 0.27.1; listed, not demoting)",
        "driver: 580.2 (claim: 580.1; listed, not demoting)",
        "repeats: 1 per launch x 2 launches (claim: 3; listed, not demoting)",
    ]
    assert c1["hypotheses"] == [{"study": "bench", "hypothesis": "c1", "verdict": "confirmed", "gpu": "h100-sxm",
                                 "faithful": True, "differs": c1["differs"]}]


def test_another_gpu_makes_it_approximate(bench: tuple[Catalog, Path]) -> None:
    c1 = _rows(*bench, _run(gpu="NVIDIA H200"))["b-c1"]
    assert c1["status"] == "approximate" and c1["differs"][0] == "gpu: h200 (claim: h100-sxm)"


def test_each_demoting_condition_is_worked_out_from_the_plan(bench: tuple[Catalog, Path]) -> None:
    rows = _rows(*bench, _run())
    assert rows["b-eager"]["status"] == "approximate"
    assert [d for d in rows["b-eager"]["differs"] if "listed" not in d] == ["concurrency: c4 (claim: c64)"]
    drawn = rows["b-drawn"]  # drawn up to 96 matches; c4 is one of the claim's levels
    assert drawn["status"] == "faithful"
    kept = rows["b-kept"]  # a kept arm against a reset one, both arms max_num_seqs: graphs has vLLM's default
    assert kept["status"] == "approximate"
    assert [d for d in kept["differs"] if "listed" not in d] == ["engine max_num_seqs: -, 64 (claim: 64)"]
    capacity = rows["b-capacity"]  # a server metric: no workload, load or cache to compare
    assert [d for d in capacity["differs"] if "listed" not in d] == ["gpu: h100-sxm (claim: h200)"]


def test_a_claim_no_hypothesis_names_is_untested_with_its_reason(bench: tuple[Catalog, Path]) -> None:
    rows = _rows(*bench, _run())
    assert rows["b-untested"] == {**rows["b-untested"], "status": "untested", "reason": "needs 8 GPUs",
                                  "hypotheses": [], "differs": []}
    assert rows["b-forgotten"]["reason"] == "no hypothesis tests it yet"


def test_a_hypothesis_not_yet_run_is_not_a_faithful_test_when_runs_are_read(bench: tuple[Catalog, Path]) -> None:
    measured = _rows(*bench, None, verdict="not run")["b-c1"]
    assert measured["status"] == "approximate" and measured["differs"][0] == "run: not run (claim: a run)"
    assert measured["hypotheses"][0]["gpu"] == "planned for h100-sxm"
    planned = _rows(*bench, None, verdict="not run", measured=False)["b-c1"]  # no database: plans compared
    assert planned["status"] == "faithful" and not any(d.startswith("run:") for d in planned["differs"])


def test_the_faithful_test_is_shown_first(bench: tuple[Catalog, Path], tmp_path: Path) -> None:
    catalog, path = bench
    text = STUDY.replace('claims = ["b-eager"]', 'claims = ["b-eager", "b-c1"]')
    other = tmp_path / "other.toml"
    other.write_text(text.replace('id = "bench"', 'id = "bench-2"', 1))
    ctxs = [build_context(load_study(other), replace(_run(gpu="NVIDIA H200"), run=RunRecord(
        run_id="r2", study_id="bench-2", gpu_name="NVIDIA H200"))), build_context(load_study(path), _run())]
    scores = {c.study.study.id: [_score(h.id, "refuted") for h in c.study.hypothesis] for c in ctxs}
    row = next(r for r in claim_rows(catalog, ctxs, scores) if r.claim == "b-c1")
    assert [(t.study, t.hypothesis) for t in row.tests] == [("bench", "c1"), ("bench-2", "c1"), ("bench-2", "eager-ratio")]
    assert row.status == "faithful"
    assert counts([row]) == {"bench-doc": {"faithful": 1, "approximate": 0, "untested": 0}}


@pytest.mark.parametrize("workload, kind", [("fixed", "random"), ("shared", "shared-prefix")])
def test_dataset_kind(bench: tuple[Catalog, Path], workload: str, kind: str) -> None:
    from compiler.plan_compile import compile_study

    plan = compile_study(load_study(bench[1]))
    assert {dataset_kind(p) for p in plan.points if p.workload == workload} == {kind}


def test_conditions_any_is_not_compared(bench: tuple[Catalog, Path]) -> None:
    catalog, path = bench
    doc = catalog.documents[0]
    loose = tuple(replace_conditions(c, Conditions(input_len="any", output_len="any", cache="any"))
                  if c.id == "b-kept" else c for c in doc.claims)
    ctx = build_context(load_study(path), _run())
    rows = claim_rows(Catalog((replace(doc, claims=loose),)), [ctx], {"bench": []})
    kept = next(r for r in rows if r.claim == "b-kept")
    assert [d for d in kept.differs if "listed" not in d] == []


def replace_conditions(claim, cond):  # type: ignore[no-untyped-def]
    return claim.model_copy(update={"conditions": cond})


def test_the_cli_prints_every_claim_of_the_repository_as_json() -> None:
    result = CliRunner().invoke(main, ["claims", "--format", "json", "--sources", str(REPO / "sources"),
                                       *map(str, sorted((REPO / "studies").glob("*.toml")))])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    assert len(rows) == len(load_catalog(REPO / "sources").ids) >= 60
    assert {tuple(sorted(r)) for r in rows} == {("claim", "differs", "document", "hypotheses", "numbers", "reason",
                                                  "section", "status", "text")}
    for r in rows:
        assert r["status"] in ("faithful", "approximate", "untested")
        assert bool(r["reason"]) == (r["status"] == "untested") and bool(r["hypotheses"]) != (r["status"] == "untested")
        if r["status"] == "approximate":
            assert r["differs"] and any("listed" not in d for d in r["differs"])


def test_the_cli_refuses_a_missing_database_and_sources(tmp_path: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(main, ["claims", "--db", str(tmp_path / "none.duckdb"), "--sources", str(REPO / "sources")])
    assert result.exit_code == 1 and "no such database" in result.output and "Traceback" not in result.output
    result = runner.invoke(main, ["claims", "--sources", str(tmp_path / "nowhere")])
    assert result.exit_code == 1 and "give --sources DIR" in result.output


def test_no_source_document_is_named_in_report_code() -> None:
    ids = [d.id for d in load_catalog(REPO / "sources").documents]
    for path in (REPO / "report").rglob("*.py"):
        text = path.read_text()
        assert not [i for i in ids if i in text], path


def test_the_site_shows_every_claim_and_each_study_its_differences(tmp_path: Path) -> None:
    from report.pages.site import build_site
    from tests.report.helpers import make_db, write_study
    from tests.report.test_scoring import HYPOTHESES, _points

    shutil.copytree(REPO / "sources", tmp_path / "sources")
    hypotheses = HYPOTHESES.replace('predict = { value = 100.0, tolerance = 0.05 }\n',
                                    'predict = { value = 100.0, tolerance = 0.05 }\n'
                                    'claims = ["roofline-02-batch1-throughput"]\n', 1)
    study = write_study(tmp_path, hypotheses)
    db = make_db(tmp_path / "r.duckdb", _points())
    build_site([db], tmp_path / "site", study_paths=[study], ledger=False)
    index = (tmp_path / "site/index.html").read_text()
    part = index[index.index('id="claims"'):index.index('id="by-seed"')]
    assert part.count('<tr id="claim-') == len(load_catalog(REPO / "sources").ids)
    row = part[part.index('id="claim-roofline-02-batch1-throughput"'):]
    row = row[:row.index("</tr>")]
    assert "approximate" in row and 'href="studies/toy/index.html#h-tight"' in row
    assert "gpu: " in row and "model: tiny-qwen3 (claim: qwen3-8b)" in row
    assert 'id="claim-roofline-09-three-h100s-1pct"' in part and "needs three physical H100s" in part
    page = (tmp_path / "site/studies/toy/index.html").read_text()
    assert 'id="claims"' in page and "model: tiny-qwen3 (claim: qwen3-8b)" in page


def test_the_site_counts_the_claims_of_studies_not_yet_run(tmp_path: Path) -> None:
    """The index's claims table reads every study file of the studies folder, as `studyc claims` does: a
    study not yet run still tests its claims (by its plan, "run: not run")."""
    from report.pages.site import build_site
    from tests.report.helpers import make_db, write_study
    from tests.report.test_scoring import HYPOTHESES, _points

    shutil.copytree(REPO / "sources", tmp_path / "sources")
    studies = tmp_path / "studies"
    studies.mkdir()
    write_study(studies, HYPOTHESES)
    unrun = HYPOTHESES.replace('predict = { value = 100.0, tolerance = 0.05 }\n',
                               'predict = { value = 100.0, tolerance = 0.05 }\nclaims = ["roofline-04-cheaper-card"]\n', 1)
    write_study(studies, unrun, study_id="later", title="Not yet run")
    db = make_db(tmp_path / "r.duckdb", _points())
    build_site([db], tmp_path / "site", studies_dir=studies, ledger=False)
    index = (tmp_path / "site/index.html").read_text()
    row = index[index.index('id="claim-roofline-04-cheaper-card"'):]
    row = row[:row.index("</tr>")]
    assert "approximate" in row and "later/tight" in row and "run: not run (claim: a run)" in row
    assert not (tmp_path / "site/studies/later").exists()  # no page: it has no run


def test_engine_values_come_from_the_parsed_engine_then_the_argv(bench: tuple[Catalog, Path]) -> None:
    from compiler.plan_compile import compile_study
    from report.claims import engine_value

    plan = compile_study(load_study(bench[1]))
    by_arm = {x.arm: x for x in plan.launches}
    graphs, eager, kept = by_arm["graphs"], by_arm["eager"], by_arm["kept"]
    assert engine_value(eager, "enforce_eager") is True and engine_value(graphs, "enforce-eager") is False
    assert engine_value(kept, "max_num_seqs") == 64 and engine_value(graphs, "max_num_seqs") is None
    assert engine_value(graphs, "enable_prefix_caching") is True and engine_value(graphs, "kv_cache_dtype") == "auto"
    assert engine_value(graphs, "max_model_len") == "2048"  # from the argv: `--max-model-len 2048`
    assert engine_value(graphs, "attention_backend") is None  # not given
    odd = graphs.model_copy(update={"argv": (*graphs.argv, "--flag-alone", "--attention-backend=FLASH_ATTN",
                                             "--no-async-scheduling", "--last-flag")})
    assert engine_value(odd, "flag_alone") is True and engine_value(odd, "last_flag") is True
    assert engine_value(odd, "attention_backend") == "FLASH_ATTN" and engine_value(odd, "async_scheduling") is False


def test_a_drawn_length_is_told_by_its_distribution(bench: tuple[Catalog, Path]) -> None:
    from compiler.claims import Drawn
    from compiler.plan_compile import compile_study
    from report.claims import _claim_length, _length, _length_matches

    plan = compile_study(load_study(bench[1]))
    drawn = next(p for p in plan.points if p.workload == "drawn")
    fixed = next(p for p in plan.points if p.workload == "fixed")
    assert _length(drawn, "output_len") == "drawn (max 96)" and _length(drawn, "input_len") == "128"
    assert _length(fixed, "output_len") == "1024"
    assert _length_matches("drawn (max 96)", Drawn(max=96)) and not _length_matches("drawn (max 95)", Drawn(max=96))
    assert _length_matches("drawn (max 96)", Drawn()) and _length_matches("drawn (max 96)", "drawn")
    assert not _length_matches("1024", Drawn(max=96)) and not _length_matches("drawn (max 96)", 96)
    assert _length_matches("1024", 1024) and not _length_matches("1023", 1024)
    assert (_claim_length(Drawn(max=96)), _claim_length(Drawn()), _claim_length(128)) == ("drawn (max 96)", "drawn",
                                                                                           "128")


def test_values_are_written_as_the_tables_show_them() -> None:
    from report.claims import Difference, _text

    assert [_text(v) for v in (True, False, 0.5, 2.0, None, 64, "x")] == ["true", "false", "0.5", "2", "-", "64", "x"]
    assert str(Difference("gpu", "h200", "h100-sxm", True)) == "gpu: h200 (claim: h100-sxm)"
    assert str(Difference("vllm", "0.26.0", "0.27.1", False)) == "vllm: 0.26.0 (claim: 0.27.1; listed, not demoting)"


EVERY_KEY = '''
[[claim]]
id = "b-every"
text = "differs in every condition"
conditions = { gpu = "h200", gpus = 4, replicas = 4, model = ["qwen3-8b"], weights = "real", input_len = 4096, output_len = { max = 96 }, dataset = "shared-prefix", cache = "keep", concurrency = [64], engine = { max_num_seqs = 256, enforce_eager = true }, vllm = "0.27.1", driver = "580.1", repeats = 3 }

[[claim]]
id = "b-rate"
text = "an open-loop claim"
conditions = { rate = [2.0], engine = { enforce_eager = false } }
'''


def test_every_condition_a_claim_states_is_compared_and_written_out(tmp_path: Path) -> None:
    (tmp_path / "sources").mkdir()
    (tmp_path / "sources" / "bench-doc.toml").write_text(SOURCE + EVERY_KEY)
    study = tmp_path / "bench.toml"
    study.write_text(STUDY.replace('claims = ["b-c1"]', 'claims = ["b-c1", "b-every", "b-rate"]'))
    rows = _rows(load_catalog(tmp_path / "sources"), study, _run())
    assert rows["b-every"]["status"] == "approximate"
    assert rows["b-every"]["differs"] == [
        "gpu: h100-sxm (claim: h200)",
        "gpus: 1 (claim: 4)",
        "replicas: 1 (claim: 4)",
        "model: tiny-qwen3 (claim: qwen3-8b)",
        "input_len: 128 (claim: 4096)",
        "output_len: 1024 (claim: drawn (max 96))",
        "dataset: random (claim: shared-prefix)",
        "cache: reset (claim: keep)",
        "concurrency: c1 (claim: c64)",
        "engine max_num_seqs: - (claim: 256)",
        "engine enforce_eager: false (claim: true)",
        "weights: dummy (claim: real)",
        "vllm: 0.26.0 (claim: 0.27.1; listed, not demoting)",
        "driver: 580.2 (claim: 580.1; listed, not demoting)",
        "repeats: 1 per launch x 2 launches (claim: 3; listed, not demoting)",
    ]
    assert [d for d in rows["b-rate"]["differs"] if "listed" not in d] == ["rate: c1 (claim: 2 req/s)"]
    planned = _rows(load_catalog(tmp_path / "sources"), study, None, verdict="not run", measured=False)["b-every"]
    assert planned["differs"][0] == "gpu: h100-sxm (planned) (claim: h200)"
    assert "vllm: not run (claim: 0.27.1; listed, not demoting)" in planned["differs"]
    assert not any(d.startswith("driver") for d in planned["differs"])  # no run: no driver to compare


def test_the_index_tables_and_a_study_s_claims_are_built_from_the_rows(bench: tuple[Catalog, Path]) -> None:
    from report.claims import claims_tables, study_claims

    catalog, path = bench
    ctx = build_context(load_study(path), _run())
    rows = claim_rows(catalog, [ctx], {"bench": [_score(h.id, "confirmed") for h in ctx.study.hypothesis]})
    (table,) = claims_tables(rows, catalog, lambda sid: f"studies/{sid}/index.html")
    assert (table.document, table.title) == ("bench-doc", "Bench doc")
    assert table.counts == "7 claims: 2 faithful, 3 approximate, 2 untested"
    lines = {line.claim: line for line in table.rows}
    assert [line.claim for line in table.rows] == ["b-c1", "b-eager", "b-drawn", "b-kept", "b-capacity", "b-untested",
                                                   "b-forgotten"]
    c1 = lines["b-c1"]
    assert (c1.status, c1.section, c1.text, c1.reason) == ("faithful", "", "c1", "")
    (cell,) = c1.tests
    assert (cell.label, cell.href, cell.verdict, cell.gpu, cell.faithful) == (
        "bench/c1", "studies/bench/index.html#h-c1", "confirmed", "h100-sxm", True)
    assert lines["b-untested"].tests == () and lines["b-untested"].reason == "needs 8 GPUs"
    assert lines["b-eager"].differs[0] == "concurrency: c4 (claim: c64)" and not lines["b-eager"].tests[0].faithful
    mine = study_claims(rows, "bench")
    assert [(c.claim, c.hypothesis, c.faithful) for c in mine] == [
        ("b-c1", "c1", True), ("b-eager", "eager-ratio", False), ("b-drawn", "drawn", True), ("b-kept", "kept", False),
        ("b-capacity", "capacity", False)]
    assert mine[0].document == "bench-doc" and mine[0].text == "c1" and mine[1].differs[0] == "concurrency: c4 (claim: c64)"
    assert study_claims(rows, "other") == ()

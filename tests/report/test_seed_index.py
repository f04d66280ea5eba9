"""The index's verdicts by seed document: a study's `source` parsed into (document, section), where each
hypothesis goes, the order of sections, the launches a hypothesis rests on, and the rendered section."""

from __future__ import annotations

import shutil
import tomllib
from datetime import datetime
from pathlib import Path

import pytest

from compiler.claims import load_catalog
from report.pages.seed_index import NO_SEED, launches, place, section_key, seed_refs, seed_source
from report.pages.site import build_site
from report.results import RunData
from report.scoring.score_model import Score
from runner.store.records import PointRecord, RunRecord, ServerRecord
from tests.report.helpers import REPO, make_db, write_study
from tests.report.test_scoring import HYPOTHESES, _points

H100, TWELVE = "h100-roofline-study", "twelve-serving-experiments"
DOCS = load_catalog(REPO / "sources").documents


# -- parsing a source --------------------------------------------------------------------------------


@pytest.mark.parametrize("source, expected", [
    ("h100-roofline-study, sections 02 and 04", (H100, "sections 02 and 04")),
    ("h100-roofline-study, section 07 (the case it did not measure)", (H100, "section 07 (the case it did not measure)")),
    ("twelve-serving-experiments, 'What failed': load past the knee", (TWELVE, "'What failed': load past the knee")),
    ("  H100-Roofline-Study ,  section 02  ", (H100, "section 02")),  # case and spaces
    ("h100-roofline-study: section 09", (H100, "section 09")),
    ("h100-roofline-study", (H100, "")),  # a document, no section named
    ("h100-roofline-study,", (H100, "")),
])
def test_a_source_naming_a_known_document(source: str, expected: tuple[str, str]) -> None:
    assert seed_source(source, DOCS) == expected


@pytest.mark.parametrize("source", [
    "", "   ", "an issue on the tracker", "h100-roofline-study-v2, section 02",  # only a prefix of another name
    "see h100-roofline-study, section 02",  # named, but not as the source's document
    "h100 roofline study, section 02", "twelve serving experiments, 'What worked' 3",  # not the id
])
def test_a_source_without_a_known_document_has_no_seed(source: str) -> None:
    assert seed_refs(source, DOCS) == ()
    assert seed_source(source, DOCS) == (NO_SEED, source.strip())


def test_a_source_quoting_two_documents_gives_both_in_order() -> None:
    source = "h100-roofline-study, section 03; twelve-serving-experiments, 'Compiled CUDA graphs'"
    assert seed_refs(source, DOCS) == ((H100, "section 03"), (TWELVE, "'Compiled CUDA graphs'"))
    assert seed_source(source, DOCS) == (H100, "section 03")
    assert seed_refs("a blog post; twelve-serving-experiments, 'Final configuration'", DOCS) == (
        (TWELVE, "'Final configuration'"),)  # a part naming no document is passed over


# -- where a hypothesis goes -------------------------------------------------------------------------


def test_a_hypothesis_of_a_two_document_study_goes_to_the_one_it_names() -> None:
    study = "h100-roofline-study, section 03; twelve-serving-experiments, 'Compiled CUDA graphs'"
    assert place(study, "Running eager halves throughput at batch 1", DOCS) == (H100, "section 03")
    assert place(study, "p95 ITL 24.2 ms eager -> ~6.5 ms with graphs (twelve experiments, 4B model)", DOCS) == (
        TWELVE, "'Compiled CUDA graphs'")
    assert place(study, "", DOCS) == (H100, "section 03")


def test_a_hypothesis_source_naming_a_document_as_a_source_wins() -> None:
    assert place("", "twelve-serving-experiments, 'What worked' 2", DOCS) == (TWELVE, "'What worked' 2")
    assert place("h100-roofline-study, section 08", "h100-roofline-study, section 02", DOCS) == (H100, "section 02")


def test_a_name_in_a_quote_does_not_move_a_one_document_study() -> None:
    assert place("h100-roofline-study, section 02", "as the twelve experiments found", DOCS) == (H100, "section 02")
    assert place("", "as the twelve experiments found", DOCS) == (NO_SEED, "")
    assert place("scaled down from a GPU study", "", DOCS) == (NO_SEED, "scaled down from a GPU study")


def test_every_study_in_the_repository_has_its_seed() -> None:
    """Every study file but the CPU quickstart, engine-fork, launch-cost and graph-sizes (studyc's own cost) names a
    seed; cuda-graphs splits across the two documents."""
    found: dict[str, set[str]] = {}
    for path in sorted((REPO / "studies").glob("*.toml")):
        data = tomllib.loads(path.read_text(encoding="utf-8"))
        study = data["study"]
        for hyp in data.get("hypothesis", []):
            found.setdefault(study["id"], set()).add(place(study.get("source", ""), hyp.get("source", ""), DOCS)[0])
    assert found.pop("quickstart") == {NO_SEED}
    assert found.pop("engine-fork") == {NO_SEED}
    assert found.pop("launch-cost") == {NO_SEED}
    assert found.pop("graph-sizes") == {NO_SEED}
    assert found.pop("cuda-graphs") == {H100, TWELVE}
    assert found["decode-roofline"] == {H100} and found["past-the-knee"] == {TWELVE}
    assert all(len(docs) == 1 and NO_SEED not in docs for docs in found.values()), found


# -- section order -----------------------------------------------------------------------------------


def test_sections_sort_in_document_order() -> None:
    h100 = ["section 08", "sections 02-06", "section 07 (the case it did not measure)", "section 02",
            "sections 02 and 04", "not a section", "section 10"]
    assert sorted(h100, key=lambda s: section_key(H100, s, DOCS)) == [
        "section 02", "sections 02 and 04", "sections 02-06", "section 07 (the case it did not measure)",
        "section 08", "not a section", "section 10"]
    twelve = ["'Final configuration'", "'What failed': load past the knee", "'What worked' 3",
              "'Compiled CUDA graphs'", "'Where my own measurements misled me'",
              "'What worked' 2 and 'Where my own measurements misled me'", "scaled down from a study"]
    assert sorted(twelve, key=lambda s: section_key(TWELVE, s, DOCS)) == [
        "'Compiled CUDA graphs'", "'What worked' 2 and 'Where my own measurements misled me'", "'What worked' 3",
        "'What failed': load past the knee", "'Where my own measurements misled me'", "'Final configuration'",
        "scaled down from a study"]
    assert sorted(["b", "a", ""], key=lambda s: section_key(NO_SEED, s, DOCS)) == ["", "a", "b"]


# -- launches ----------------------------------------------------------------------------------------


def _score(point_ids: tuple[str, ...]) -> Score:
    return Score(study_id="s", hypothesis="h", claim="c", metric="output_throughput", unit="tok/s", kind="value",
                 relation=None, tolerance=0.1, ratio=False, targets=(), predicted=1.0, predicted_spec=1.0,
                 band_low=0.9, band_high=1.1, band_low_spec=0.9, band_high_spec=1.1, values=(), n=0, measured=None,
                 ci_low=None, ci_high=None, spread_low=None, spread_high=None, error=None, error_spec=None,
                 off_band=None, off_band_spec=None, verdict="not run", verdict_spec="not run", run_id="r",
                 calibrated=False, point_ids=point_ids)


def _run() -> RunData:
    servers = (ServerRecord("r", "s/a/L1", launch_id="s/a/L1"), ServerRecord("r", "s/a/L2", launch_id="s/a/L2"),
               ServerRecord("r", "s/a/L2~2", launch_id="s/a/L2"),  # the launch resumed: its servers again
               ServerRecord("r", "s/r/L1/s1", launch_id="s/r/L1"), ServerRecord("r", "s/r/L1/s2", launch_id="s/r/L1"),
               ServerRecord("r", "s/old"))  # stored before launch ids were
    points = (PointRecord("r", "s/a/L1/w/c1/r1", "s/a/L1", repeat=1), PointRecord("r", "s/a/L1/w/c1/r1", "s/a/L1",
                                                                                   repeat=2),
              PointRecord("r", "s/a/L2/w/c1/r1", "s/a/L2"), PointRecord("r", "s/a/L2/w/c8/r1", "s/a/L2~2"),
              PointRecord("r", "s/old/w/c1/r1", "s/old"), PointRecord("r", "s/none/w/c1/r1", None))
    run = RunRecord(run_id="r", study_id="s", study_path="s.toml", study_sha256="0", plan_json="{}",
                    studyc_version="0", git_sha=None, host="h", started_at=datetime(2025, 1, 1), finished_at=None,
                    status="complete", vllm_version=None, torch_version=None, gpu_name=None, calibrated=False)
    return RunData(Path("r.duckdb"), run, servers, points, (), ())


def test_launches_count_each_launch_once() -> None:
    run = _run()
    assert launches(_score(("s/a/L1/w/c1/r1", "s/a/L1/w/c1/r1")), run) == 1  # repeats of one launch
    assert launches(_score(("s/a/L1/w/c1/r1", "s/a/L2/w/c1/r1", "s/a/L2/w/c8/r1")), run) == 2  # resumed: one
    assert launches(_score(("s/r/L1/s1", "s/r/L1/s2")), run) == 1  # a server metric on two replicas
    assert launches(_score(("s/old/w/c1/r1", "s/old")), run) == 1  # no launch id: the server is the launch
    assert launches(_score(("s/a/L1/w/search", "s/a/L2/w/search")), run) == 2  # capacity searches
    assert launches(_score(("s/none/w/c1/r1",)), run) == 1  # a point without a server: itself
    assert launches(_score(()), run) is None and launches(_score(("s/a/L1/w/c1/r1",)), None) is None


# -- on the index ------------------------------------------------------------------------------------


def _with_source(path: Path, source: str) -> Path:
    text = path.read_text()
    path.write_text(text.replace('hardware = "cpu"', f'hardware = "cpu"\nsource = "{source}"', 1))
    return path


def test_the_index_groups_the_verdicts_by_document_then_section(tmp_path: Path) -> None:
    shutil.copytree(REPO / "sources", tmp_path / "sources")  # the documents are data beside the studies
    toy = _with_source(write_study(tmp_path, HYPOTHESES), "h100-roofline-study, section 02")
    twelve = _with_source(write_study(tmp_path, HYPOTHESES, study_id="knob", title="Knob study"),
                          "twelve-serving-experiments, 'What worked' 3")
    bare = write_study(tmp_path, HYPOTHESES, study_id="bare", title="Bare study")
    db = make_db(tmp_path / "r.duckdb", _points())
    build_site([db], tmp_path / "site", study_paths=[bare, twelve, toy], ledger=False)
    page = (tmp_path / "site/index.html").read_text()
    assert page.index("<h1>") < page.index('<table class="list">') < page.index('id="by-seed"')  # kept, then added
    part = page[page.index('id="by-seed"'):]
    heads = [part.index(f'id="seed-{d}"') for d in (H100, TWELVE, "no-seed")]
    assert heads == sorted(heads)
    assert "“What is an H100 actually doing?”" in part and ">No seed</h3>" in part
    assert "6 hypotheses:" in part and "section 02" in part and "&#39;What worked&#39; 3" in part
    assert "no source given" in part
    assert 'href="studies/toy/index.html#h-tight"' in part and 'href="studies/knob/index.html#h-capacity"' in part
    h100 = part[heads[0]:heads[1]]
    assert h100.count("<tr>") - 1 == 6 and 'title="interval: ' in h100  # six rows under the header
    launch_cells = [c.split(">", 1)[1] for c in h100.split('<td class="num"')[1:]]
    assert [c.split("<", 1)[0] for c in launch_cells] == ["1", "1", "1", "1", "1", "2"]  # capacity: both arms
    assert part[heads[1]:heads[2]].count('<td class="num">-</td>') == 6  # knob never ran

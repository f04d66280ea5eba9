"""Claims as data: the sources files load with their document's conditions under each claim, refuse bad
input naming file, line and key, and a hypothesis naming an unknown claim is refused by validate."""

from __future__ import annotations

from pathlib import Path

import pytest

from base.errors import SpecError
from compiler.claims import Drawn, find_sources, load_catalog, unknown_claims
from compiler.load import load_study
from tests.report.helpers import REPO, write_study

SOURCE = '''
[document]
id = "bench-a"
title = "Bench A"
aliases = ["The A Bench"]
sections = ["Intro", "02"]
url = "https://example.org/bench-a"

[conditions]
gpu = "h100-sxm"
model = ["qwen3-8b"]
output_len = 1024
engine = { max_model_len = 4096 }

[[claim]]
id = "a-01-first"
section = "01"
text = "It runs at 150 tok/s."
numbers = { "tok/s" = 150 }
conditions = { concurrency = [1], output_len = { max = 96 }, engine = { enforce_eager = true } }

[[claim]]
id = "a-02-second"
section = "02"
text = "Needs eight GPUs."
untested = "needs 8 GPUs"
'''


def _sources(tmp: Path, text: str = SOURCE, name: str = "bench-a.toml") -> Path:
    folder = tmp / "sources"
    folder.mkdir(exist_ok=True)
    (folder / name).write_text(text)
    return folder


def test_a_claim_takes_the_document_conditions_and_overrides_them(tmp_path: Path) -> None:
    catalog = load_catalog(_sources(tmp_path))
    (doc,) = catalog.documents
    assert (doc.id, doc.title, doc.aliases, doc.sections) == ("bench-a", "Bench A", ("the a bench",), ("intro", "02"))
    assert doc.url == "https://example.org/bench-a" and doc.path == tmp_path / "sources" / "bench-a.toml"
    first = catalog.claim("a-01-first")
    assert first is not None and first[0] is doc
    cond = first[1].conditions
    assert cond.gpu == "h100-sxm" and cond.model == ["qwen3-8b"]  # the document's
    assert cond.cache is None and cond.concurrency == [1]  # neither says: not compared
    assert cond.output_len == Drawn(max=96) and cond.concurrency == [1]  # the claim's own wins
    assert cond.engine == {"max_model_len": 4096, "enforce_eager": True}  # engine tables merge
    second = catalog.claim("a-02-second")
    assert second is not None and second[1].conditions.output_len == 1024 and second[1].untested == "needs 8 GPUs"
    assert catalog.ids == ("a-01-first", "a-02-second") and catalog.claim("nope") is None
    assert unknown_claims(["a-01-first", "nope"], catalog) == ["nope"]


def test_no_sources_folder_is_an_empty_catalog(tmp_path: Path) -> None:
    assert load_catalog(None).documents == () and load_catalog(tmp_path / "missing").ids == ()


def test_find_sources_looks_in_the_folder_and_above(tmp_path: Path) -> None:
    folder = _sources(tmp_path)
    (tmp_path / "studies" / "examples").mkdir(parents=True)
    assert find_sources(tmp_path / "studies" / "examples") == folder
    assert find_sources(REPO / "studies") == REPO / "sources"


def _line(text: str, start: str) -> int:
    """The line (1-based) at which `start` begins a line; it may span lines."""
    return text[:text.index("\n" + start) + 1].count("\n") + 1 if not text.startswith(start) else 1


@pytest.mark.parametrize("old, new, line_of, where", [
    ('text = "It runs at 150 tok/s."', 'txt = "x"', 'txt = ', "claim[0].txt: unknown key"),
    ('output_len = 1024', 'output_len = "long"', 'output_len = ', "conditions.output_len: "),
    ('id = "a-02-second"', 'id = "a-01-first"', 'id = "a-01-first"\nsection = "02"',
     "claim[1].id: claim id 'a-01-first' appears twice"),
    ('id = "a-01-first"', 'id = "A First"', 'id = "A First"', "claim[0].id: String should match pattern"),
    ('[document]\n', '[document\n', '[document', "TOML syntax: "),
    ('title = "Bench A"\n', '', '[document]', "document.title: required key is missing"),
])
def test_a_bad_sources_file_names_file_line_and_key(tmp_path: Path, old: str, new: str, line_of: str,
                                                    where: str) -> None:
    bad = SOURCE.replace(old, new, 1)
    folder = _sources(tmp_path, bad)
    with pytest.raises(SpecError) as err:
        load_catalog(folder)
    assert f"{folder / 'bench-a.toml'}:{_line(bad, line_of)}: {where}" in str(err.value)


def test_a_union_key_is_named_without_pydantic_member_tags(tmp_path: Path) -> None:
    """`output_len` takes a number, a table or a word: every error about it names the key alone."""
    bad = SOURCE.replace("output_len = 1024", 'output_len = "long"', 1)
    folder = _sources(tmp_path, bad)
    with pytest.raises(SpecError) as err:
        load_catalog(folder)
    lines = str(err.value).splitlines()
    assert lines and all(f"bench-a.toml:{_line(bad, 'output_len = ')}: conditions.output_len: " in line
                         for line in lines), lines
    assert any("should be" in line and "Input should be" not in line for line in lines)


def test_every_bad_file_is_reported_at_once(tmp_path: Path) -> None:
    _sources(tmp_path, SOURCE.replace('text = "It runs at 150 tok/s."', 'txt = "x"'), "bench-a.toml")
    _sources(tmp_path, SOURCE.replace('id = "bench-a"', 'id = "bench-b"').replace('[document]\n', '[document\n'),
             "bench-b.toml")
    with pytest.raises(SpecError) as err:
        load_catalog(tmp_path / "sources")
    assert "bench-a.toml:" in str(err.value) and "bench-b.toml:2: TOML syntax: " in str(err.value)


def test_a_claim_id_in_two_documents_is_refused(tmp_path: Path) -> None:
    _sources(tmp_path)
    _sources(tmp_path, SOURCE.replace('id = "bench-a"', 'id = "bench-b"').replace('id = "a-02-second"', 'id = "b-02"'),
             "bench-b.toml")
    line = _line(SOURCE, 'id = "a-01-first"')
    with pytest.raises(SpecError, match=rf"bench-b.toml:{line}: claim\[0\].id: 'a-01-first' is already a claim of bench-a"):
        load_catalog(tmp_path / "sources")


CLAIMED = '''
[[hypothesis]]
id = "tight"
claim = "c1 throughput is 100 tok/s"
metric = "output_throughput"
where = { arm = "a", concurrency = 1 }
predict = { value = 100.0, tolerance = 0.05 }
claims = ["a-01-first", "a-01-frist"]
'''


def test_validate_refuses_an_unknown_claim_id_with_its_line(tmp_path: Path) -> None:
    _sources(tmp_path)
    path = write_study(tmp_path, CLAIMED)
    with pytest.raises(SpecError) as err:
        load_study(path)
    line = path.read_text().splitlines().index('claims = ["a-01-first", "a-01-frist"]') + 1
    assert str(err.value) == (f"{path}:{line}: hypothesis[0].claims: unknown claim 'a-01-frist' in "
                              f"{tmp_path / 'sources'}; did you mean 'a-01-first'?")


def test_a_study_naming_claims_without_a_sources_folder_is_warned_of(tmp_path: Path) -> None:
    """A copy outside the repository (`studyc new --from` elsewhere) still loads; validate says its claims
    were not checked."""
    path = write_study(tmp_path, CLAIMED)
    if find_sources(tmp_path) is not None:
        pytest.skip("a sources/ folder above the temporary directory")
    loaded = load_study(path)
    line = path.read_text().splitlines().index('claims = ["a-01-first", "a-01-frist"]') + 1
    assert [str(w) for w in loaded.warnings] == [
        f"{path}:{line}: hypothesis[0].claims: its claims are not checked: no sources/ folder here or above "
        "(claims files, one per document)"]


def test_known_claims_validate(tmp_path: Path) -> None:
    _sources(tmp_path)
    loaded = load_study(write_study(tmp_path, CLAIMED.replace(', "a-01-frist"', "")))
    assert loaded.study.hypothesis[0].claims == ["a-01-first"]


def test_the_repository_sources_load_and_every_study_names_known_claims() -> None:
    catalog = load_catalog(REPO / "sources")
    assert [d.id for d in catalog.documents] == ["h100-roofline-study", "twelve-serving-experiments"]
    assert len(catalog.ids) >= 60
    for path in sorted((REPO / "studies").glob("*.toml")):
        loaded = load_study(path)  # raises on an unknown claim id
        assert not unknown_claims([c for h in loaded.study.hypothesis for c in h.claims], catalog)

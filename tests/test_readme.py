"""The front door stays a front door: README.md is short, every link in it, CONTRIBUTING.md and docs/ lands,
and every command, flag and setting the README shows exists. Each check is a function tried on a bad snippet
(it must complain) and on the repository's own files (they must pass)."""

from __future__ import annotations

import re
from pathlib import Path

import click
import pytest
from click.testing import CliRunner, Result

from tests.conftest import REPO

README_MAX_LINES = 300
MIN_DOC_PAGES = 5


# ---- the checks ------------------------------------------------------------------------------------------

def too_long(text: str, limit: int = README_MAX_LINES) -> str | None:
    n = len(text.splitlines())
    return f"{n} lines, over {limit}: move reference to docs/" if n > limit else None


def _prose(text: str) -> str:
    """The text with fenced code blocks and inline code blanked, so a `[x](y)` in code is not a link."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", lambda m: m.group(1) or "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(text: str) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for heading in re.findall(r"^#{1,6} +(.+?) *#*$", _prose_keep_headings(text), re.M):
        base = slug(heading)
        n = seen.get(base, 0)
        out.add(base if n == 0 else f"{base}-{n}")
        seen[base] = n + 1
    return out


def _prose_keep_headings(text: str) -> str:
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def broken_links(path: Path, text: str) -> list[str]:
    """Each relative link or #anchor in `text` (the file at `path`) that does not resolve."""
    bad = []
    for target in re.findall(r"\]\(([^)\s]+)(?: \"[^\"]*\")?\)", _prose(text)):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if file and not dest.exists():
            bad.append(f"{path.name}: {target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest.read_text() if file else text):
            bad.append(f"{path.name}: {target}: no heading #{anchor} in {dest.name}")
    return bad


def cli_options() -> dict[str, set[str]]:
    """Each command of the `studyc` click group with the flags it takes."""
    from studyc.cli import main

    assert isinstance(main, click.Group)
    return {name: {o for p in cmd.params for o in (*p.opts, *p.secondary_opts) if o.startswith("-")}
            for name, cmd in main.commands.items()}


def _shown_commands(text: str) -> list[str]:
    """Every command line the text shows: code-block lines that run studyc (with their indented
    continuation lines) and inline code spans that start with `studyc `."""
    shown: list[str] = []
    for block in re.findall(r"^```[^\n]*\n(.*?)^```", text, re.S | re.M):
        going = False  # the line before ran studyc, so an indented line continues it
        for line in block.splitlines():
            line = re.sub(r"\s#.*", "", line)
            if re.match(r"\s*(?:\w+=(?:\"[^\"]*\"|\S+) +)*(?:\S*/)?studyc ", line):
                shown.append(line)
                going = True
            elif going and line.startswith(" ") and line.strip():
                shown[-1] += " " + line
            else:
                going = False
    shown += re.findall(r"`(studyc [^`\n]+)`", text)
    return shown


def unknown_cli(text: str, options: dict[str, set[str]]) -> list[str]:
    """Each `studyc <command>` the text shows that the CLI lacks, and each flag shown after one that
    its command does not take."""
    bad = []
    for line in _shown_commands(text):
        for m in re.finditer(r"studyc ([a-z][\w-]*)(.*?)(?=\bstudyc [a-z]|&&|$)", line):
            command, rest = m.group(1), m.group(2)
            if command not in options:
                bad.append(f"studyc {command}: no such command")
                continue
            for flag in re.findall(r"(?<![\w-])(--[a-z][\w-]*)", rest):
                if flag not in options[command]:
                    bad.append(f"studyc {command} {flag}: no such option")
    return bad


def setting_names() -> set[str]:
    """The STUDYC_* variables the settings object reads (base/settings.py)."""
    from base.settings import Settings

    prefix = Settings.model_config.get("env_prefix", "")
    return {(prefix + name).upper() for name in Settings.model_fields}


def unknown_settings(text: str, known: set[str]) -> list[str]:
    return sorted({f"{name}: not a field of the settings object" for name in re.findall(r"\bSTUDYC_[A-Z0-9_]*[A-Z0-9]", text)
                   if name not in known})


def _read_elsewhere(name: str) -> bool:
    """A variable the code reads directly (not through the settings object: the golden files' switch, the
    site's fit workers), by its literal name in a source file other than this one."""
    return any(name in p.read_text() for d in ("compiler", "runner", "report", "studyc", "scripts", "base", "tests")
               for p in (REPO / d).rglob("*")
               if p.suffix in (".py", ".sh") and p.is_file() and p.resolve() != Path(__file__).resolve())


def too_few(pages: list[str], minimum: int = MIN_DOC_PAGES) -> str | None:
    """docs/ must hold the reference: at least `minimum` pages."""
    return f"docs/ has {len(pages)} pages, under {minimum}: {', '.join(pages)}" if len(pages) < minimum else None


def unmapped(readme: str, pages: list[str]) -> list[str]:
    """The docs pages the README links nowhere: its map of docs/ must name each one."""
    linked = set(re.findall(r"\]\(docs/([^)#\s]+)", _prose(readme)))
    return [f"docs/{name}: not in the README's map of the docs" for name in pages if name not in linked]


# ---- the repository --------------------------------------------------------------------------------------

DOCS = sorted((REPO / "docs").glob("*.md"))
PAGES = [REPO / "README.md", REPO / "CONTRIBUTING.md", *DOCS]


def test_the_readme_is_a_front_door() -> None:
    assert too_long((REPO / "README.md").read_text()) is None


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_relative_link_and_anchor_resolves(page: Path) -> None:
    assert page.exists(), f"{page.name} is missing"
    assert broken_links(page, page.read_text()) == []


def test_the_readmes_commands_are_read() -> None:
    assert len(_shown_commands((REPO / "README.md").read_text())) >= 12  # the commands table, the first study


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_command_and_flag_shown_exists(page: Path) -> None:
    assert unknown_cli(page.read_text(), cli_options()) == []


def test_every_setting_the_readme_names_is_a_field_of_the_settings_object() -> None:
    text = (REPO / "README.md").read_text()
    assert "STUDYC_VLLM" in text
    assert unknown_settings(text, setting_names()) == []


def test_every_setting_the_docs_name_is_read_by_the_product() -> None:
    known = setting_names()
    for page in PAGES:
        for problem in unknown_settings(page.read_text(), known):
            name = problem.split(":")[0]
            assert _read_elsewhere(name), f"{page.name}: {name} is neither a setting nor read by any module"


def test_docs_holds_the_reference_and_the_readme_maps_it() -> None:
    assert too_few([p.name for p in DOCS]) is None
    assert unmapped((REPO / "README.md").read_text(), [p.name for p in DOCS]) == []


# ---- each check fails where it should --------------------------------------------------------------------

def test_too_long_names_the_count() -> None:
    assert too_long("x\n" * 301) == "301 lines, over 300: move reference to docs/"
    assert too_long("x\n" * 300) is None


def test_broken_links_finds_a_missing_file_and_a_missing_anchor(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A page\n\n## Held starts\n\n## Held starts\n")
    page = tmp_path / "README.md"
    good = ("[a](docs/a.md) [b](docs/a.md#held-starts) [c](docs/a.md#held-starts-1) [d](#top-of-it)\n"
            "[web](https://example.com/x.md) `[code](nowhere.md)`\n```\n[block](nowhere.md)\n```\n# Top of it\n")
    assert broken_links(page, good) == []
    bad = "[x](docs/b.md) [y](docs/a.md#cold-starts) [z](#nowhere)\n"
    assert broken_links(page, bad) == [
        "README.md: docs/b.md: no such file",
        "README.md: docs/a.md#cold-starts: no heading #cold-starts in a.md",
        "README.md: #nowhere: no heading #nowhere in README.md",
    ]


def test_slug_follows_github() -> None:
    assert slug("What `studyc run` sends, and why") == "what-studyc-run-sends-and-why"
    assert slug("Before and after, one study, one machine, one day") == "before-and-after-one-study-one-machine-one-day"
    assert slug("The load generator's own ceiling") == "the-load-generators-own-ceiling"


def test_unknown_cli_finds_a_missing_command_and_a_foreign_flag() -> None:
    options = {"run": {"--db", "--resume"}, "audit": {"--db", "--format"}}
    good = "```bash\nstudyc run s.toml --db x  # then --resume\n  --resume\nbash scripts/test.sh --fast\n" \
           "STUDYC_VLLM=\"python3 -m vllm\" .venv/bin/studyc run S --resume && studyc audit S --format json\n```\n" \
           "`studyc audit S --format json` and `--fast` elsewhere"
    assert unknown_cli(good, options) == []
    bad = "```\nstudyc run s.toml --dbb x\nstudyc frobnicate\nX=\"a b\" studyc run S && studyc audit S --resume\n```\n" \
          "`studyc audit S --resume`"
    assert unknown_cli(bad, options) == [
        "studyc run --dbb: no such option", "studyc frobnicate: no such command", "studyc audit --resume: no such option",
        "studyc audit --resume: no such option",
    ]


def test_unknown_cli_reads_continuation_lines_of_a_command() -> None:
    options = {"run": {"--db"}}
    assert unknown_cli("```\nstudyc run S --db X\n          [--turbo]\n```\n", options) == [
        "studyc run --turbo: no such option"]


def test_unknown_settings_names_a_variable_the_settings_object_lacks() -> None:
    known = setting_names()
    assert {"STUDYC_VLLM", "STUDYC_CACHE_DIR"} <= known
    assert unknown_settings("set `STUDYC_VLLM` and `STUDYC_CACHE_DIR`", known) == []
    assert unknown_settings("set `STUDYC_VLLM_PATH` or STUDYC_GPU", known) == [
        "STUDYC_GPU: not a field of the settings object", "STUDYC_VLLM_PATH: not a field of the settings object"]


def test_read_elsewhere_tells_a_read_variable_from_an_invented_one() -> None:
    assert _read_elsewhere("STUDYC_MACHINE_ID")
    assert not _read_elsewhere("STUDYC_NO_SUCH_KNOB")


def test_unmapped_names_a_page_the_readme_does_not_link() -> None:
    readme = "| [docs/gpu.md](docs/gpu.md) | ... |\nsee [checks](docs/checks.md#the-checks)\n`[x](docs/site.md)`\n"
    assert unmapped(readme, ["gpu.md", "checks.md"]) == []
    assert unmapped(readme, ["gpu.md", "site.md"]) == ["docs/site.md: not in the README's map of the docs"]


def test_too_few_counts_the_pages() -> None:
    assert too_few(["faults.md", "gpu.md"]) == "docs/ has 2 pages, under 5: faults.md, gpu.md"
    assert too_few(["a.md", "b.md", "c.md", "d.md", "e.md"]) is None


def brief_study(readme: str) -> str:
    """The README's "A study file, in brief": its first TOML block."""
    block = re.search(r"^```toml\n(.*?)^```", readme, re.S | re.M)
    assert block, "the README shows no study file"
    return block.group(1)


def validate_in_a_tree(tmp: Path, study: str) -> Result:
    """`studyc validate` on `study` placed as studies/brief.toml beside the repository's models/ and sources/."""
    from studyc.cli import main

    (tmp / "studies").mkdir()
    for folder in ("models", "sources"):
        (tmp / folder).symlink_to(REPO / folder)
    (tmp / "studies" / "brief.toml").write_text(study)
    return CliRunner().invoke(main, ["validate", str(tmp / "studies" / "brief.toml")])


def test_the_readmes_study_file_validates(tmp_path: Path) -> None:
    result = validate_in_a_tree(tmp_path, brief_study((REPO / "README.md").read_text()))
    assert result.exit_code == 0, result.output
    assert "ok (1 hypothesis)" in result.output


def test_a_broken_study_file_in_the_readme_would_be_caught(tmp_path: Path) -> None:
    study = brief_study((REPO / "README.md").read_text()).replace("concurrency = [1, 8, 32, 128]",
                                                                   "concurrency = [1, 8, 32, 0]")
    result = validate_in_a_tree(tmp_path, study)
    assert result.exit_code == 2
    assert "brief.toml:" in result.output and "load.concurrency[3]" in result.output


PATH_IN_REPO = re.compile(r"(?<![\w/.-])((?:compiler|runner|report|base|studyc|scripts|tests|benchmarks|studies|sources|models"
                          r"|site_templates)/[\w/.-]*\w\.(?:py|sh|toml|md|jsonl?|csv))\b")
PLACEHOLDER = re.compile(r"/(?:x|test_x|my_\w+)\.\w+$")  # names the reader makes: studies/my_first.toml
ELSEWHERE = {"benchmarks/multi_turn/benchmark_serving_multi_turn.py"}  # vLLM's own repository


def missing_paths(text: str, root: Path) -> list[str]:
    """Each file of the repository the text names (`report/verdict.py`) that is not there: a module moved
    or renamed since the page was written."""
    return [f"{p}: no such file" for p in sorted(set(PATH_IN_REPO.findall(text)))
            if not PLACEHOLDER.search(p) and p not in ELSEWHERE and not (root / p).exists()]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_file_a_page_names_exists(page: Path) -> None:
    assert missing_paths(page.read_text(), REPO) == []


def test_missing_paths_finds_a_moved_module(tmp_path: Path) -> None:
    (tmp_path / "report").mkdir()
    (tmp_path / "report" / "verdict.py").write_text("")
    text = "one rule: `report/verdict.py`; write `studies/my_first.toml`; scored by report/scoring.py."
    assert missing_paths(text, tmp_path) == ["report/scoring.py: no such file"]

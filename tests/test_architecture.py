"""The floor plan: no import cycle, no arrow up the stages, small modules that each say their job.

Stages, lowest first: the shared base (`base`: errors, the formatter, settings, the version) <
`compiler` < `runner` < `report` < the CLI (`studyc`). A module may import its own stage or lower ones,
so nothing below the CLI imports `studyc`, not even for its version. Function-level imports count: a
cycle hidden inside a function is still a cycle. Every package ships in the wheel (pyproject's list),
and report/ keeps its modules in rooms by job (stats, scoring, planning, ledger, pages), not one flat room.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STAGE = {"base": 0, "compiler": 1, "runner": 2, "report": 3, "studyc": 4}
PACKAGES = tuple(STAGE)
MAX_LINES = 450
MAX_TOP_MODULES = {"report": 15}  # past this a package is one flat room: folders by job, as runner/ has


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            found[name.removesuffix(".__init__")] = path
    return found


def _target(name: str, known: dict[str, Path]) -> str | None:
    """The project module an imported name lives in (the longest known prefix), else None."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in known:
            return candidate
    return None


def import_graph(known: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the project modules it imports, at any depth of its body."""
    graph: dict[str, set[str]] = {name: set() for name in known}
    for name, path in known.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                names = [base] + [f"{base}.{alias.name}" for alias in node.names]
            for imported in names:
                target = _target(imported, known)
                if target is not None and target != name:
                    graph[name].add(target)
    return graph


def stage(module: str) -> int:
    return STAGE[module.split(".")[0]]


def upward_arrows(graph: dict[str, set[str]]) -> list[str]:
    return sorted(f"{a} -> {b}" for a, targets in graph.items() for b in targets if stage(b) > stage(a))


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_module_imports_a_later_stage() -> None:
    assert upward_arrows(import_graph(_modules())) == []


def test_no_import_cycle() -> None:
    assert cycles(import_graph(_modules())) == []


def test_the_checks_catch_a_cycle_and_an_upward_arrow() -> None:
    graph = {"compiler.a": {"runner.b"}, "runner.b": {"compiler.a"}, "base.errors": set()}
    assert upward_arrows(graph) == ["compiler.a -> runner.b"]
    assert cycles(graph) == [["compiler.a", "runner.b"]]
    assert upward_arrows({"base.errors": {"compiler.a"}, "compiler.a": set()}) == ["base.errors -> compiler.a"]
    # the CLI package is the top stage, its __init__ too: importing it for its version is an arrow up
    assert upward_arrows({"runner.c": {"studyc", "base"}, "studyc": set(), "base": set()}) == ["runner.c -> studyc"]
    assert cycles({"a.x": {"a.y"}, "a.y": set()}) == []


def test_relative_imports_and_packages_resolve(tmp_path: Path) -> None:
    pkg = tmp_path / "runner" / "server"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text('"""x"""\n')
    (pkg / "engine.py").write_text("from . import pins\nfrom ..store import db\n")
    (pkg / "pins.py").write_text("def f():\n    import report.page\n")
    known = {"runner.server": pkg / "__init__.py", "runner.server.engine": pkg / "engine.py",
             "runner.server.pins": pkg / "pins.py", "runner.store.db": tmp_path / "db.py",
             "report.page": tmp_path / "page.py"}
    (tmp_path / "db.py").write_text("")
    (tmp_path / "page.py").write_text("")
    graph = import_graph(known)
    assert graph["runner.server.engine"] == {"runner.server", "runner.server.pins", "runner.store.db"}
    assert upward_arrows(graph) == ["runner.server.pins -> report.page"]


def _third_party_imports(known: dict[str, Path]) -> list[str]:
    """What the project's modules import from outside it when they are imported (not inside functions)."""
    names: set[str] = set()
    for path in known.values():
        stack: list[ast.AST] = list(ast.parse(path.read_text(encoding="utf-8")).body)
        while stack:
            node = stack.pop()
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                names.add(node.module)
            elif not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                stack.extend(ast.iter_child_nodes(node))
    return sorted(n for n in names if n.split(".")[0] not in STAGE and n != "__future__")


# One fresh interpreter imports what the project imports from outside it (the slow part: pydantic, duckdb,
# altair...), then forks a child per project module that imports that module first and alone: a fresh
# interpreter each, as far as the project's modules go, for a fraction of the cost. The children keep the
# bytecode they compile in a folder of the parent's (under PYTHONDONTWRITEBYTECODE each would compile every
# project module it imports from source again: the same code, compiled once here), and their garbage
# collections leave the parent's objects alone (gc.freeze).
_FORK_EACH = """
import atexit, gc, importlib, os, shutil, sys, tempfile
for name in sys.argv[1].split():
    try:
        importlib.import_module(name)
    except Exception:
        pass
assert not any(m.split(".")[0] in sys.argv[3].split() for m in sys.modules), "the parent imported the project"
sys.pycache_prefix = tempfile.mkdtemp(prefix="studyc-imports-")
sys.dont_write_bytecode = False
atexit.register(shutil.rmtree, sys.pycache_prefix, True)
gc.freeze()
for module in sys.argv[2].split():
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            importlib.import_module(module)
            os._exit(0)
        except BaseException as exc:
            os.write(write, f"{module}: {type(exc).__name__}: {exc}".encode())
            os._exit(1)
    os.close(write)
    with os.fdopen(read, "rb") as said:
        why = said.read().decode()
    _, status = os.waitpid(pid, 0)
    if status:
        print(why or f"{module}: exit status {status}", flush=True)
"""


def imports_alone_failures(modules: list[str], preload: list[str], root: Path = ROOT) -> list[str]:
    """Each module imported first and alone (a forked child each, after `preload`), from `root`; one line per
    module that fails."""
    packages = " ".join(sorted({m.split(".")[0] for m in modules}))
    done = subprocess.run([sys.executable, "-c", _FORK_EACH, " ".join(preload), " ".join(modules), packages],
                          cwd=root, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_every_module_imports_alone_in_a_fresh_interpreter() -> None:
    """A cycle that only bites in some import order shows here: each module first, alone."""
    modules = sorted(m for m in _modules() if not m.endswith("__main__"))  # importing __main__ runs the CLI
    assert imports_alone_failures(modules, _third_party_imports(_modules())) == []


def test_a_module_that_fails_only_when_imported_first_is_named(tmp_path: Path) -> None:
    """`a` imports `b`, which takes a name from the half-built `a`: `a` first fails, `b` first works."""
    (tmp_path / "cyc").mkdir()
    (tmp_path / "cyc" / "__init__.py").write_text("")
    (tmp_path / "cyc" / "a.py").write_text("import json\nimport cyc.b\nG = 1\n")
    (tmp_path / "cyc" / "b.py").write_text("from cyc.a import G\n")
    (tmp_path / "cyc" / "c.py").write_text("import cyc.b\n")  # b first, then a: the order that works
    failed = imports_alone_failures(["cyc.a", "cyc.b", "cyc.c"], ["json"], tmp_path)
    assert [line.split(":")[0] for line in failed] == ["cyc.a"]
    assert "ImportError" in failed[0] and "'G'" in failed[0]
    mod = tmp_path / "m.py"  # what a module imports from outside the project when it is imported
    mod.write_text("import json\nimport compiler.x\nfrom . import y\ntry:\n    from a.b import c\nexcept ImportError:\n"
                   "    pass\ndef f():\n    import ray\n")
    assert _third_party_imports({"compiler.m": mod}) == ["a.b", "json"]


def test_every_module_is_small_and_names_its_job() -> None:
    too_long, silent = [], []
    for name, path in _modules().items():
        text = path.read_text(encoding="utf-8")
        if len(text.splitlines()) > MAX_LINES:
            too_long.append(f"{name}: {len(text.splitlines())} lines")
        doc = ast.get_docstring(ast.parse(text))
        if not doc or not doc.strip():
            silent.append(name)
    assert too_long == []
    assert silent == []


def undeclared_packages(root: Path) -> list[str]:
    """Packages (folders with an __init__.py) under the stages that pyproject.toml's list leaves out of the wheel."""
    declared = set(tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(root).parts) for s in STAGE for p in (root / s).rglob("__init__.py")}
    return sorted(found - declared)


def test_every_package_ships_in_the_wheel(tmp_path: Path) -> None:
    assert undeclared_packages(ROOT) == []
    for package in ("base", "report", "report/rooms"):
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text('"""x"""\n')
    (tmp_path / "pyproject.toml").write_text('[tool.setuptools]\npackages = ["base", "report"]\n')
    assert undeclared_packages(tmp_path) == ["report.rooms"]


def crowded(root: Path, limits: dict[str, int]) -> list[str]:
    """Packages holding more modules at their top level than their limit, with the count."""
    counts = {package: len(list((root / package).glob("*.py"))) for package in limits}
    return [f"{p}/: {n} modules at its top level (at most {limits[p]})" for p, n in counts.items() if n > limits[p]]


def test_report_is_rooms_by_job_not_one_flat_room(tmp_path: Path) -> None:
    assert crowded(ROOT, MAX_TOP_MODULES) == []
    (tmp_path / "report" / "scoring").mkdir(parents=True)
    for name in ("__init__", "results", "audit", "scoring/__init__", "scoring/verdict"):
        (tmp_path / "report" / f"{name}.py").write_text('"""x"""\n')
    assert crowded(tmp_path, {"report": 3}) == []
    (tmp_path / "report" / "verdict.py").write_text('"""x"""\n')
    assert crowded(tmp_path, {"report": 3}) == ["report/: 4 modules at its top level (at most 3)"]

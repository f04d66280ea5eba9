"""The vLLM engine adapter against a real CPU server, and fake engines that crash or hang."""

from __future__ import annotations

import json
import os
import shlex
import stat
import time
from pathlib import Path

import pytest

from base.settings import Settings, derive_python, load_settings
from runner.checks.cache import reset_prefix_cache
from runner.server import engine
from runner.server.engine import (
    EngineError,
    VllmServer,
    _group_alive,
    http_call,
)
from runner.server.engine_check import check_engine
from runner.server.introspect import parse_kv_capacity_log
from tests.conftest import (
    TINY_KV_TOKENS,
    TINY_MODEL,
    TINY_SERVE_ENV,
    TINY_SERVE_FLAGS,
    VLLM_VENV,
    vllm_missing,
)

needs_vllm = pytest.mark.skipif(vllm_missing() is not None, reason=vllm_missing() or "")


def _script(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def _listening_addresses(port: int) -> list[str]:
    """Local addresses (hex, as /proc/net shows them) listening on `port`."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            local, state = row.split()[1], row.split()[3]
            addr, port_hex = local.rsplit(":", 1)
            if state == "0A" and int(port_hex, 16) == port:
                found.append(addr)
    return found


# --- the real CPU server -------------------------------------------------------------
# (that its start and stop leave no process is checked on the session's server: tests/conftest.py)


@pytest.mark.vllm
def test_real_server_is_ready_and_described(vllm_server: VllmServer) -> None:
    info = vllm_server.info
    assert info is not None
    assert http_call("GET", info.base_url + "/health")[0] == 200
    assert info.base_url == f"http://127.0.0.1:{info.port}"
    assert info.pid == vllm_server.pid
    assert 0 < info.startup_s < 300
    version = json.loads(http_call("GET", info.base_url + "/version")[1])["version"]
    assert info.vllm_version == version
    assert info.torch_version and "cpu" in info.torch_version
    # 256 MiB of KV at 1 KiB per token; vLLM's own figure, not ours.
    assert info.kv_capacity_tokens == TINY_KV_TOKENS
    assert info.kv_capacity_source == "metrics:kv_cache_size_tokens"
    assert info.gpu_name is None and info.driver_version is None
    assert info.log_path.read_text().startswith("# studyc: ")


@pytest.mark.vllm
def test_real_server_log_line_agrees_on_kv_capacity(vllm_server: VllmServer) -> None:
    log = vllm_server.log_path.read_text()
    assert "CPU KV cache size: 262,144 tokens" in log
    assert parse_kv_capacity_log(log) == TINY_KV_TOKENS


@pytest.mark.vllm
def test_real_server_listens_on_loopback_only_and_needs_its_key(vllm_server: VllmServer) -> None:
    assert _listening_addresses(vllm_server.port) == ["0100007F"]  # 127.0.0.1, nothing else
    # The API key is not printed into the log.
    assert vllm_server.api_key not in vllm_server.log_path.read_text()
    status, _ = http_call("GET", vllm_server.base_url + "/v1/models")
    assert status == 401
    status, _ = http_call("GET", vllm_server.base_url + "/v1/models", vllm_server.api_key)
    assert status == 200


# --- fakes: what a real server cannot be made to do on demand -------------------------


def test_crash_at_start_leads_with_the_root_cause_once(tmp_path: Path) -> None:
    fake = _script(
        tmp_path,
        "fake-vllm",
        'i=0; while [ $i -lt 50 ]; do echo "loading line $i"; i=$((i+1)); done\n'
        'echo "Traceback (most recent call last):"\necho \'  File "serve.py", line 3, in main\'\n'
        'echo "ValueError: boom: unsupported model" >&2\n'
        'echo "RuntimeError: Engine core initialization failed. See root cause above."\nexit 3\n',
    )
    server = VllmServer(
        ["serve", "m"], log_path=tmp_path / "log.txt", command=[str(fake)], startup_timeout_s=30, key_dir=tmp_path
    )
    with pytest.raises(EngineError) as err, server:
        pass
    msg = str(err.value.message)
    assert msg.startswith("ValueError: boom: unsupported model\n")
    assert msg.count("boom") == 1
    assert "exited with code 3" in msg and str(tmp_path / "log.txt") in msg
    assert "loading line" not in msg and "Traceback" not in msg and 'File "' not in msg


def test_crash_without_an_exception_line_shows_the_log_tail(tmp_path: Path) -> None:
    fake = _script(
        tmp_path, "fake-vllm", 'i=0; while [ $i -lt 50 ]; do echo "loading line $i"; i=$((i+1)); done\nexit 3\n'
    )
    server = VllmServer(
        ["serve", "m"], log_path=tmp_path / "log.txt", command=[str(fake)], startup_timeout_s=30, key_dir=tmp_path
    )
    with pytest.raises(EngineError) as err, server:
        pass
    msg = str(err.value.message)
    assert msg.startswith("vLLM exited with code 3 during startup; last lines of ")
    assert "loading line 49" in msg
    assert "loading line 5\n" not in msg  # only the tail, not the whole log


@pytest.mark.vllm
@needs_vllm
def test_real_server_that_cannot_start_names_the_root_cause(tmp_path: Path, tiny_model_dir: Path) -> None:
    flags = list(TINY_SERVE_FLAGS)
    flags[flags.index("--kv-cache-memory-bytes") + 1] = "4000G"  # far more than this host's memory
    server = VllmServer(
        ["serve", str(tiny_model_dir), *flags], env=TINY_SERVE_ENV, log_path=tmp_path / "server.log",
        startup_timeout_s=300, command=load_settings().vllm_argv, key_dir=load_settings().cache_path,
    )
    with pytest.raises(EngineError) as err, server:
        pass
    msg = str(err.value.message)
    first = msg.splitlines()[0]
    assert first.startswith("ValueError: Available memory on node 0 ") and "Decrease --kv-cache-memory-bytes" in first
    assert msg.count("Available memory on node 0") == 1
    assert "Traceback" not in msg and 'File "' not in msg and "RuntimeError" not in msg
    assert str(tmp_path / "server.log") in msg and len(msg.splitlines()) == 2
    assert "Traceback" in (tmp_path / "server.log").read_text()  # the whole story stays in the log


def test_check_engine_names_a_missing_command(tmp_path: Path) -> None:
    with pytest.raises(EngineError, match="engine command not found: .*set STUDYC_VLLM"):
        check_engine([str(tmp_path / "no-such-vllm")])
    with pytest.raises(EngineError, match="empty.*STUDYC_VLLM"):
        check_engine([])


def test_check_engine_names_a_failing_command(tmp_path: Path) -> None:
    broken = _script(
        tmp_path, "broken-vllm",
        'echo "Traceback (most recent call last):" >&2\n'
        'echo "ModuleNotFoundError: No module named \'vllm\'" >&2\nexit 1\n',
    )
    with pytest.raises(EngineError) as err:
        check_engine([str(broken)])
    msg = str(err.value.message)
    assert "exited with code 1" in msg and "ModuleNotFoundError: No module named 'vllm'" in msg
    assert "STUDYC_VLLM" in msg and "Traceback" not in msg
    silent = _script(tmp_path, "silent", "exit 0\n")
    with pytest.raises(EngineError, match="printed no version"):
        check_engine([str(silent)])
    slow = _script(tmp_path, "slow", "sleep 30\n")
    with pytest.raises(EngineError, match="did not finish within 1 s"):
        check_engine([str(slow)], timeout_s=1)


def test_check_engine_returns_the_printed_version(tmp_path: Path) -> None:
    fake = _script(tmp_path, "vllm", 'echo "W1201 triton not available" >&2\necho "0.32.0+cpu"\n')
    got = check_engine([str(fake)])
    assert (got.version, got.executable, got.command) == ("0.32.0+cpu", str(fake), (str(fake),))


def test_a_passed_check_is_remembered_until_the_executable_changes(tmp_path: Path) -> None:
    """With a cache folder a command runs once (with arguments too: keyed by all its words); a rewritten
    script runs again; a failure is never remembered; without the folder it runs every time."""
    runs, cache = tmp_path / "runs.txt", tmp_path / "cache"

    def ran() -> int:
        return len(runs.read_text().splitlines()) if runs.exists() else 0

    fake = _script(tmp_path, "vllm", f'echo run >> {runs}\necho "0.32.0+cpu"\n')
    assert check_engine([str(fake)], cache_dir=cache).version == "0.32.0+cpu" and ran() == 1
    assert check_engine([str(fake)], cache_dir=cache).version == "0.32.0+cpu" and ran() == 1
    for _ in range(2):  # other words: another command, checked once
        assert check_engine([str(fake), "--extra"], cache_dir=cache).version == "0.32.0+cpu" and ran() == 2
    check_engine([str(fake)])
    assert ran() == 3
    _script(tmp_path, "vllm", f'echo run >> {runs}\necho "0.33.0rc1+cpu"\n')  # another size
    assert check_engine([str(fake)], cache_dir=cache).version == "0.33.0rc1+cpu" and ran() == 4
    _script(tmp_path, "vllm", f'echo run >> {runs}\necho "ImportError: no torch" >&2\nexit 1\n')
    for _ in range(2):
        with pytest.raises(EngineError, match="no torch"):
            check_engine([str(fake)], cache_dir=cache)
    assert ran() == 6


def test_a_module_command_is_remembered_until_its_package_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`python3 -m pkg.cli` (device.sh's engine command): the second check spawns nothing; a package
    reinstalled (its folder rewritten) or found elsewhere on PYTHONPATH is checked again."""
    runs, cache, site, other = tmp_path / "runs.txt", tmp_path / "cache", tmp_path / "site", tmp_path / "other"

    def ran() -> int:
        return len(runs.read_text().splitlines()) if runs.exists() else 0

    python = _script(tmp_path, "python3", f'echo "$@" >> {runs}\necho "0.26.0"\n')
    (site / "fakevllm").mkdir(parents=True)
    (site / "fakevllm" / "__init__.py").write_text("")
    monkeypatch.setenv("PYTHONPATH", str(site))
    command = [str(python), "-m", "fakevllm.cli"]
    assert check_engine(command, cache_dir=cache).version == "0.26.0" and ran() == 1
    assert runs.read_text().split() == ["-m", "fakevllm.cli", "--version"]
    assert check_engine(command, cache_dir=cache).version == "0.26.0" and ran() == 1  # no second spawn
    (site / "fakevllm" / "cli.py").write_text("")  # reinstalled: a file added to the package's folder
    assert check_engine(command, cache_dir=cache).version == "0.26.0" and ran() == 2
    assert check_engine(command, cache_dir=cache).version == "0.26.0" and ran() == 2
    (other / "fakevllm").mkdir(parents=True)
    monkeypatch.setenv("PYTHONPATH", f"{other}:{site}")  # another copy comes first
    assert check_engine(command, cache_dir=cache).version == "0.26.0" and ran() == 3


@pytest.mark.vllm
@needs_vllm
def test_check_engine_on_the_real_cpu_vllm() -> None:
    got = check_engine(shlex.split(os.environ["STUDYC_VLLM"]))
    assert got.version.startswith("0.") and "cpu" in got.version


def test_port_taken_at_bind_is_retried_on_a_new_port(tmp_path: Path) -> None:
    fake = _script(tmp_path, "busy", 'echo "OSError: [Errno 98] Address already in use"\nexit 1\n')
    server = VllmServer(
        ["serve", "m"], log_path=tmp_path / "log.txt", command=[str(fake)], startup_timeout_s=30, key_dir=tmp_path
    )
    with pytest.raises(EngineError, match="exited with code 1"):
        server.wait_ready()
    headers = [
        line for line in (tmp_path / "log.txt").read_text().splitlines() if line.startswith("# studyc:")
    ]
    assert len(headers) == 3  # the first try and two retries, each on a port of its own
    assert len({h.split("--port ")[1].split()[0] for h in headers}) == 3


def test_startup_timeout_kills_the_group(tmp_path: Path) -> None:
    # A "server" that never answers and has a child of its own.
    fake = _script(tmp_path, "hang", "echo starting\nsleep 600 &\nwait\n")
    server = VllmServer(
        ["serve", "m"], log_path=tmp_path / "log.txt", command=[str(fake)], startup_timeout_s=1.5, key_dir=tmp_path
    )
    server.start()
    pgid = server.pid
    assert pgid is not None
    t0 = time.monotonic()
    with pytest.raises(EngineError, match="did not answer /health within 2 s") as err:
        server.wait_ready()
    assert "starting" in str(err.value.message)
    assert time.monotonic() - t0 < 20
    assert _group_alive(pgid) == []


def test_ctrl_c_while_waiting_leaves_no_orphans_even_if_sigterm_is_ignored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = _script(tmp_path, "stubborn", "trap '' TERM\nsleep 600 &\nsleep 600 &\nwait\n")
    server = VllmServer(
        ["serve", "m"],
        log_path=tmp_path / "log.txt",
        command=[str(fake)],
        startup_timeout_s=60, key_dir=tmp_path,
        stop_timeout_s=1,
    )
    server.start()
    pgid = server.pid
    assert pgid is not None
    deadline = time.monotonic() + 10
    while len(_group_alive(pgid)) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(_group_alive(pgid)) == 3

    def interrupted(*args: object, **kwargs: object) -> tuple[int, str]:
        raise KeyboardInterrupt

    monkeypatch.setattr(engine, "http_call", interrupted)
    with pytest.raises(KeyboardInterrupt):
        server.wait_ready()
    assert _group_alive(pgid) == []  # SIGTERM was ignored: SIGKILL after stop_timeout_s


def test_missing_engine_command_is_an_engine_error(tmp_path: Path) -> None:
    server = VllmServer(
        ["serve", "m"],
        log_path=tmp_path / "log.txt",
        command=[str(tmp_path / "no-such-vllm")],
        startup_timeout_s=5, key_dir=tmp_path,
    )
    with pytest.raises(EngineError, match="cannot run the engine command"):
        server.start()


def test_studyc_owns_host_port_and_key(tmp_path: Path) -> None:
    for flag in ("--host", "--port=8000", "--api-key"):
        with pytest.raises(EngineError, match="must not set"):
            VllmServer(["serve", "m", flag], log_path=tmp_path / "log", command=["vllm"], startup_timeout_s=1, key_dir=tmp_path)


def test_multi_word_command_argv(tmp_path: Path) -> None:
    # `python3 -m vllm.entrypoints.cli.main serve ...` must work as the engine command.
    server = VllmServer(
        ["serve", "m", "--load-format", "dummy"],
        log_path=tmp_path / "log",
        command=["python3", "-m", "vllm.entrypoints.cli.main"],
        startup_timeout_s=1, key_dir=tmp_path,
        port=18000,
    )
    assert server.argv[:7] == [
        "python3",
        "-m",
        "vllm.entrypoints.cli.main",
        "serve",
        "m",
        "--load-format",
        "dummy",
    ]
    assert server.argv[7:11] == ["--host", "127.0.0.1", "--port", "18000"]
    assert len(server.argv) == 11 and server.api_key not in server.argv  # the key goes in VLLM_API_KEY
    assert server._env()["VLLM_API_KEY"] == server.api_key and len(server.api_key) >= 32
    int(server.api_key, 16)  # hex


def test_reset_prefix_cache_without_a_server_is_not_ok() -> None:
    result = reset_prefix_cache(f"http://127.0.0.1:{engine.free_port()}", "k", timeout_s=2)
    assert not result.ok and result.status == 0


# --- settings --------------------------------------------------------------------------


def test_settings_defaults_and_derived_python(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STUDYC_PYTHON", raising=False)
    monkeypatch.setenv("STUDYC_VLLM", "python3.12 -m vllm.entrypoints.cli.main")
    s = Settings()
    assert s.vllm_argv == ["python3.12", "-m", "vllm.entrypoints.cli.main"]
    assert s.python == "python3.12"
    assert s.host == "127.0.0.1" and s.gpu_index == 0 and s.startup_timeout_s == 900
    monkeypatch.setenv("STUDYC_PYTHON", "/opt/py/bin/python3")
    assert Settings().python == "/opt/py/bin/python3"


@pytest.mark.skipif(not (VLLM_VENV / "bin" / "vllm").exists(), reason="no .venv-vllm")
def test_settings_python_beside_the_vllm_script() -> None:
    assert derive_python(str(VLLM_VENV / "bin" / "vllm")) == str(VLLM_VENV / "bin" / "python3")
    assert derive_python("no-such-vllm-anywhere") == "python3"


def test_settings_refuse_a_non_loopback_host(monkeypatch: pytest.MonkeyPatch) -> None:
    from base.errors import StudycError
    from base.settings import load_settings

    monkeypatch.setenv("STUDYC_HOST", "0.0.0.0")
    with pytest.raises(StudycError, match="STUDYC_HOST"):
        load_settings()


def test_tiny_model_constants_match_the_config() -> None:
    # TINY_KV_TOKENS is derived from the model shape; keep the two in step.
    config = TINY_MODEL / "config.json"
    if not config.exists():
        pytest.skip("models/tiny-qwen3 not written yet")
    c = json.loads(config.read_text())
    bytes_per_token = c["num_hidden_layers"] * 2 * c["num_key_value_heads"] * c["head_dim"] * 2
    assert 256 * 2**20 // bytes_per_token == TINY_KV_TOKENS
    assert os.path.basename(TINY_MODEL) == "tiny-qwen3"


def test_one_private_api_key_per_user(tmp_path: Path) -> None:
    """One key for every server (a key per server made vLLM 0.26 compile cold on every start), in a
    0600 file inside a 0700 folder; a file studyc did not write is refused, naming it."""
    cache = tmp_path / "cache"
    key = engine.server_api_key(cache)
    assert engine.server_api_key(cache) == key and len(key) == 40
    int(key, 16)
    assert (cache / "api-key").stat().st_mode & 0o777 == 0o600 and cache.stat().st_mode & 0o777 == 0o700
    assert engine.server_api_key(tmp_path / "other") != key  # random, not derived
    (cache / "api-key").write_text("not a key\n")
    with pytest.raises(EngineError, match="api-key: not an API key"):
        engine.server_api_key(cache)


def test_a_new_port_is_never_one_just_found_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    """The OS may hand back the port it just gave (a fake socket does so on demand): free_port skips it."""
    import runner.server.engine as engine

    handed = iter([41000, 41000, 41000, 41001])

    class Once:
        def __enter__(self) -> Once:
            return self

        def __exit__(self, *exc: object) -> None:
            return None

        def bind(self, address: object) -> None:
            return None

        def getsockname(self) -> tuple[str, int]:
            return ("127.0.0.1", next(handed))

    monkeypatch.setattr(engine.socket, "socket", lambda *args: Once())
    assert engine.free_port() == 41000
    assert engine.free_port(avoid=frozenset({41000})) == 41001

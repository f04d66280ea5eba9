"""The engine adapter's lifecycle: one `vllm serve` process group, started with its log in a file,
awaited on /health against a deadline while watching for a crash, stopped (SIGTERM, then SIGKILL).

What the server is (versions, KV capacity) and why it failed to start are read by
`runner.server.introspect`; `runner.server.engine_check` tells before any measuring whether the engine
command runs.
"""

from __future__ import annotations

import atexit
import os
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import time
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Self

from base.errors import EngineError
from runner.server.http import http_call
from runner.server.introspect import (
    LOG_TAIL_LINES,
    ServerInfo,
    describe,
    read_log_tail,
    startup_failure,
)
from runner.server.procs import group_members

__all__ = [
    "BASE_ENV",
    "ServerInfo",
    "VllmServer",
    "engine_python",
    "free_port",
]

HOST = "127.0.0.1"
# Always set: dev mode exposes /reset_prefix_cache and /server_info; offline and no telemetry.
BASE_ENV = {
    "VLLM_SERVER_DEV_MODE": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
}
_RESERVED_FLAGS = ("--host", "--port", "--api-key")
_PORT_TAKEN = "Address already in use"
_SET_STUDYC_VLLM = "set STUDYC_VLLM to the command that starts vLLM, e.g. .venv-vllm/bin/vllm"


def free_port(host: str = HOST, avoid: frozenset[int] = frozenset()) -> int:
    """A port the OS says is free now (another process could still take it before vLLM binds), other than
    those in `avoid` (a port just found taken: the OS may hand the same one back)."""
    for _ in range(50):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
            port = int(s.getsockname()[1])
        if port not in avoid:
            return port
    return port


def _group_alive(pgid: int) -> list[int]:
    """Pids (not zombies) still in process group `pgid`."""
    if not Path("/proc").is_dir():  # not Linux: signal 0 says whether anything is left
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return []
        except PermissionError:
            pass
        return [pgid]
    return [pid for pid, _ in group_members(pgid)]


_LIVE: weakref.WeakSet[VllmServer] = weakref.WeakSet()


@atexit.register
def _stop_all() -> None:
    # Safety net for an interpreter that exits without leaving a `with` block.
    for server in list(_LIVE):
        server.stop()


def server_api_key(cache_dir: Path) -> str:
    """The servers' API key: one random secret per user, in `cache_dir/api-key` (mode 0600, folder
    0700), made on first use. One key, not one per server: vLLM 0.26 hashes VLLM_API_KEY into its
    compile-cache key and writes it into `cache_key_factors.json` in the cache, so a fresh key per
    server made every start compile from scratch and left a new secret on disk each time. The cache
    lives beside the key, in the same private folder, never in the results folder."""
    cache_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = cache_dir / "api-key"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        key = path.read_text().strip()
        if len(key) != 40 or any(c not in "0123456789abcdef" for c in key):
            raise EngineError(f"{path}: not an API key studyc wrote (40 hex digits); delete it, and the next "
                              "server start writes a new one") from None
        return key
    key = secrets.token_hex(20)  # hex: never starts with "-" (argparse would take it for a flag)
    with os.fdopen(fd, "w") as fh:
        fh.write(key + "\n")
    return key


_CLI = "vllm.entrypoints.cli.main"


def engine_python(command: Sequence[str]) -> list[str] | None:
    """The interpreter that runs vLLM's CLI for an engine command, where it can be told: `PYTHON -m
    vllm.entrypoints.cli.main` gives PYTHON; a `vllm` console script gives the interpreter of its `#!` line.
    None for anything else (a wrapper script, `env ...`, another entry point): such a server is not held."""
    words = list(command)
    if len(words) == 3 and words[1] == "-m" and words[2] == _CLI:
        return [words[0]]
    found = shutil.which(words[0]) if len(words) == 1 else None
    if found is None:
        return None
    try:
        with open(found, "rb") as fh:
            head = fh.read(4096).decode("utf-8", "replace")
    except OSError:
        return None
    first = head.splitlines()[0] if head else ""
    interpreter = first[2:].strip().split()
    if first.startswith("#!") and len(interpreter) == 1 and os.path.isabs(interpreter[0]) \
            and f"from {_CLI} import main" in head:
        return interpreter
    return None


def held_script(key_dir: Path) -> Path:
    """`runner/server/held.py`, copied alone into `key_dir/held/`: run from its own folder, Python would put
    `runner/server` first on the path, where `http.py` hides the standard library's `http`."""
    source = Path(__file__).with_name("held.py").read_bytes()
    folder = key_dir / "held"
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    script = folder / "held_start.py"
    if not script.is_file() or script.read_bytes() != source:
        tmp = folder / f"held_start.{os.getpid()}.tmp"
        tmp.write_bytes(source)
        tmp.replace(script)
    return script


class VllmServer:
    """`vllm serve` in its own process group, bound to 127.0.0.1 with a random API key.

    `argv_tail` is what follows the vLLM command (`["serve", MODEL, ...]`), without
    --host/--port/--api-key. `command` is the engine command (STUDYC_VLLM, split like a shell would),
    `key_dir` the folder of the servers' API key (`server_api_key`): the caller reads the settings.
    """

    def __init__(
        self,
        argv_tail: Sequence[str],
        *,
        command: Sequence[str],
        startup_timeout_s: float,
        key_dir: Path,
        log_path: Path,
        env: Mapping[str, str] | None = None,
        port: int | None = None,
        stop_timeout_s: float = 15.0,
        gpu_index: int = 0,
    ) -> None:
        reserved = [a for a in argv_tail if a.split("=", 1)[0] in _RESERVED_FLAGS]
        if reserved:
            raise EngineError(f"engine arguments must not set {', '.join(reserved)}: studyc sets them")
        self.command = list(command)
        if not self.command:
            raise EngineError("empty engine command (STUDYC_VLLM)")
        self.argv_tail = list(argv_tail)
        self.extra_env = dict(env or {})
        self.log_path = Path(log_path)
        self.startup_timeout_s = startup_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.gpu_index = gpu_index
        self._auto_port = port is None
        self.port = port if port is not None else free_port()
        self.key_dir = key_dir
        self.api_key = server_api_key(key_dir)
        self.info: ServerInfo | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._log_start = 0
        self._t0 = 0.0
        self._stopped = False
        self._held = False  # spawned by `hold`, waiting for `start`
        self.exit_code: int | None = None  # the code it exited with before it was ready (a failed start)

    @property
    def base_url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def poll(self) -> int | None:
        """The engine's exit code once it has exited (a crash mid-run), else None."""
        return self._proc.poll() if self._proc is not None else None

    @property
    def argv(self) -> list[str]:
        return [
            *self.command,
            *self.argv_tail,
            "--host", HOST,
            "--port", str(self.port),
        ]  # fmt: skip

    def _printable_argv(self) -> str:
        return shlex.join("REDACTED" if a == self.api_key else a for a in self.argv)

    def _env(self) -> dict[str, str]:
        """The engine's environment. The API key goes in VLLM_API_KEY (vLLM 0.26 and 0.32 read it when
        --api-key is absent), not in argv: vLLM prints its non-default arguments into the log, and
        argv is visible to every user of the host. See `server_api_key` for why it is one key."""
        return {**os.environ, **BASE_ENV, **self.extra_env, "VLLM_API_KEY": self.api_key}

    @property
    def held(self) -> bool:
        """Spawned by `hold` and not yet let go by `start`."""
        return self._held

    @property
    def log_start(self) -> int:
        """The log's size before this server's first spawn: what it wrote since is this start's."""
        return self._log_start

    def hold(self, python: Sequence[str], key_dir: Path) -> None:
        """Spawn the server held after its imports (`runner.server.held`, run by `python`, the engine's
        interpreter: `engine_python`): its imports run now, its start at `start`. Its pid and process group
        are the server's from here on."""
        if self._proc is not None:
            raise EngineError("this server was already started; make a new VllmServer")
        script = held_script(key_dir)
        self._spawn([*python, str(script), *self.argv[len(self.command):]], stdin=subprocess.PIPE)
        self._held = True

    def start(self) -> None:
        """Start the server; a held one (`hold`) is let go (its start counts from here), or spawned again
        cold if it has exited while held."""
        if self._proc is not None and not self._held:
            raise EngineError("this server was already started; make a new VllmServer")
        self._t0 = time.monotonic()
        if not self._held:
            self._spawn()
            return
        self._held = False
        assert self._proc is not None and self._proc.stdin is not None
        self.resume()
        try:
            self._proc.stdin.write(b"go\n")
            self._proc.stdin.close()
        except OSError:  # it exited while held: start it the usual way
            self._end_group()
            self._spawn()

    def pause(self, sig: signal.Signals = signal.SIGSTOP) -> None:
        """Stop a held server's process group (nothing of it runs until `resume`); `sig` is for a test that
        needs a pause that does not stop."""
        if self._held and self._proc is not None:
            self._signal_group(self._proc.pid, sig)

    def resume(self) -> None:
        if self._proc is not None:
            self._signal_group(self._proc.pid, signal.SIGCONT)

    def _spawn(self, argv: Sequence[str] | None = None, stdin: int = subprocess.DEVNULL) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        # Append: an earlier start's log is kept. Held open for the server's lifetime.
        self._log = open(self.log_path, "ab")
        self._log_start = self._log.tell()
        self._log.write(f"# studyc: {self._printable_argv()}\n".encode())
        self._log.flush()
        env = self._env()
        try:
            self._proc = subprocess.Popen(
                list(argv) if argv is not None else self.argv,
                stdin=stdin,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        except OSError as exc:
            self._log.close()
            self._log = None
            raise EngineError(
                f"cannot run the engine command {shlex.join(self.command)!r}: {exc} ({_SET_STUDYC_VLLM})"
            ) from exc
        _LIVE.add(self)

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        return read_log_tail(self.log_path, lines, self._log_start)

    def wait_ready(self) -> ServerInfo:
        """Poll /health until 200; EngineError (with the log's tail) on crash or timeout."""
        if self._proc is None:
            self.start()
        assert self._proc is not None
        deadline = self._t0 + self.startup_timeout_s
        port_retries = 2
        taken: set[int] = set()
        try:
            while True:
                rc = self._proc.poll()
                if rc is not None and self._auto_port and port_retries and _PORT_TAKEN in self.log_tail():
                    # Another process took the port between free_port() and vLLM's bind: new port.
                    port_retries -= 1
                    self._end_group()
                    taken.add(self.port)
                    self.port = free_port(avoid=frozenset(taken))
                    self._spawn()
                    continue
                if rc is not None:  # held or cold: the executor tries the launch once more, cold
                    self.exit_code = rc
                    self.stop()
                    raise EngineError(self._startup_failure(f"vLLM exited with code {rc} during startup"))
                status, _ = http_call("GET", self.base_url + "/health", self.api_key, timeout_s=5.0)
                # /health needs no key: check ours works, so a stranger on the port is not taken for us.
                if status == 200 and http_call("GET", self.base_url + "/v1/models", self.api_key)[0] == 200:
                    break
                if time.monotonic() >= deadline:
                    self.stop()
                    raise EngineError(self._startup_failure(
                        f"vLLM did not answer /health within {self.startup_timeout_s:.0f} s"
                    ))
                time.sleep(0.25)
            self.info = describe(
                base_url=self.base_url, api_key=self.api_key, port=self.port, pid=self._proc.pid,
                startup_s=time.monotonic() - self._t0, log_path=self.log_path, log_start=self._log_start,
                command=self.command, gpu_index=self.gpu_index,
            )
        except BaseException:
            # Ctrl-C or anything else while waiting: never leave a half-started server behind.
            self.stop()
            raise
        return self.info

    def _startup_failure(self, what: str) -> str:
        """The root-cause line of the log first, then what happened and where the whole log is;
        the log's last lines only when it names no exception."""
        cause = startup_failure(read_log_tail(self.log_path, 100_000, self._log_start))
        if cause is not None:
            return f"{cause}\n({what}; full log: {self.log_path})"
        return f"{what}; last lines of {self.log_path}:\n{self.log_tail()}"

    def stop(self) -> None:
        """SIGTERM the group, wait up to stop_timeout_s, then SIGKILL it. Idempotent."""
        if self._stopped or self._proc is None:
            self._stopped = True
            return
        self._stopped = True
        try:
            self._end_group()
        finally:
            _LIVE.discard(self)

    def _end_group(self) -> None:
        """End the current process group, reap the leader, close our end of the log."""
        proc = self._proc
        assert proc is not None
        pgid = proc.pid  # start_new_session: pgid == pid
        self._held = False
        try:
            self._signal_group(pgid, signal.SIGTERM)
            self._signal_group(pgid, signal.SIGCONT)  # a paused group gets its SIGTERM only once continued
            if not self._wait_group(proc, pgid, self.stop_timeout_s):
                self._signal_group(pgid, signal.SIGKILL)
                self._wait_group(proc, pgid, 10.0)
        finally:
            if proc.poll() is None:  # last resort if the group signal missed it
                proc.kill()
                proc.wait()
            if proc.stdin is not None and not proc.stdin.closed:
                proc.stdin.close()
            if self._log is not None:
                self._log.close()
                self._log = None

    @staticmethod
    def _signal_group(pgid: int, sig: signal.Signals) -> None:
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            pass

    @staticmethod
    def _wait_group(proc: subprocess.Popen[bytes], pgid: int, timeout_s: float) -> bool:
        """True once the leader is reaped and no member of the group is left."""
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None and not _group_alive(pgid):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.1)

    def __enter__(self) -> Self:
        self.start()
        self.wait_ready()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

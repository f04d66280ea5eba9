"""Held starts (`runner.execute.prestart`, `runner.server.held`): the engine's interpreter is found or the
server is not held; the check `held_start_paused` fails when the held server ran during a point (a stop
signal that does not stop, CPU ticks used, a member that came or went) and passes when it stayed stopped;
a held server nobody claims is stopped. The real vLLM path (a held start let go, paused through every
point) is asserted on the quickstart run in test_run.py.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from runner.execute.prestart import CHECK, Prestart, Quiet, paused_check, with_check
from runner.server.engine import VllmServer, engine_python, held_script
from runner.server.procs import group_cpu_ticks, group_stopped
from runner.store.records import CheckResult

HELD = Path(__file__).resolve().parents[2] / "runner/server/held.py"


def test_engine_python_from_module_form() -> None:
    assert engine_python(["/opt/py/bin/python3", "-m", "vllm.entrypoints.cli.main"]) == ["/opt/py/bin/python3"]
    assert engine_python(["python3", "-m", "vllm.entrypoints.openai.api_server"]) is None
    assert engine_python(["python3", "-m", "vllm.entrypoints.cli.main", "--x"]) is None


def test_engine_python_from_console_script(tmp_path: Path) -> None:
    script = tmp_path / "vllm"
    script.write_text("#!/opt/venv/bin/python3\nimport sys\nfrom vllm.entrypoints.cli.main import main\n")
    script.chmod(0o755)
    assert engine_python([str(script)]) == ["/opt/venv/bin/python3"]
    assert engine_python([str(script), "--flag"]) is None  # more words: not the script alone
    script.write_text("#!/usr/bin/env python3\nfrom vllm.entrypoints.cli.main import main\n")
    assert engine_python([str(script)]) is None  # `env python3`: which interpreter is not told
    script.write_text("#!/bin/sh\nexec vllm \"$@\"\n")
    assert engine_python([str(script)]) is None  # a wrapper
    assert engine_python([str(tmp_path / "absent")]) is None


def test_paused_check_boundaries() -> None:
    same = {10: 5, 11: 7}
    ok = paused_check("p", True, same, dict(same))
    assert ok.passed and ok.name == CHECK and ok.severity == "fail" and ok.value == 0.0
    one = paused_check("p", True, same, {10: 5, 11: 8})
    assert not one.passed and one.value == 1.0 and "1 CPU tick" in one.detail
    assert not paused_check("p", False, same, dict(same)).passed  # never showed as stopped
    assert not paused_check("p", True, same, {10: 5}).passed  # a member vanished
    assert not paused_check("p", True, same, {**same, 12: 0}).passed  # a member appeared
    # group_stopped needs a member, so `stopped` with an empty group does not arise; nothing used, same set:
    assert paused_check("p", True, {}, {}).passed


def test_with_check_makes_the_point_invalid() -> None:
    from runner.checks.judge import Judgement

    class Outcome:
        judgement = Judgement(summary=None, checks=(), valid=True, flagged=False)  # type: ignore[arg-type]

    outcome = Outcome()
    with_check(outcome, CheckResult("p", CHECK, True, "fail", 0.0, 0.0, "stayed stopped"))
    assert outcome.judgement.valid and outcome.judgement.reason == "valid"
    with_check(outcome, CheckResult("p", CHECK, False, "fail", 3.0, 0.0, "used 3 ticks"))
    assert not outcome.judgement.valid and outcome.judgement.reason == f"invalid: {CHECK}"
    nothing = type("O", (), {"judgement": None})()
    with_check(nothing, CheckResult("p", CHECK, False, "fail", 3.0, 0.0, "x"))
    assert nothing.judgement is None


def _fake_proc(root: Path, pgid: int, members: dict[int, tuple[str, int, int]]) -> None:
    """A /proc tree: pid -> (state, utime, stime), every member in group `pgid`."""
    for pid, (state, utime, stime) in members.items():
        d = root / str(pid)
        d.mkdir(exist_ok=True)
        rest = [state, "1", str(pgid), *["0"] * 8, str(utime), str(stime), *["0"] * 5]
        (d / "stat").write_text(f"{pid} (python3) {' '.join(rest)}\n")


def test_group_reading_from_proc(tmp_path: Path) -> None:
    _fake_proc(tmp_path, 40, {40: ("T", 100, 20), 41: ("T", 5, 1)})
    _fake_proc(tmp_path, 99, {99: ("S", 1, 1)})
    assert group_cpu_ticks(40, tmp_path) == {40: 120, 41: 6}
    assert group_stopped(40, tmp_path)
    _fake_proc(tmp_path, 40, {41: ("S", 5, 1)})
    assert not group_stopped(40, tmp_path)  # one member running
    assert not group_stopped(7, tmp_path)  # no member at all: not "stopped"


def _held_server(tmp_path: Path) -> VllmServer:
    """A VllmServer held by the real held script, run by this interpreter (no vLLM here: every import is
    skipped, then it waits on its standard input)."""
    server = VllmServer(["serve", "m"], command=[sys.executable, "-m", "vllm.entrypoints.cli.main"],
                        startup_timeout_s=5, key_dir=tmp_path / "keys", log_path=tmp_path / "s.log")
    return server


def _wait_held(server: VllmServer) -> None:
    deadline = time.monotonic() + 60
    while "waiting" not in server.log_path.read_text():
        assert time.monotonic() < deadline, server.log_path.read_text()
        time.sleep(0.05)


def test_held_server_stays_stopped_through_a_point(tmp_path: Path) -> None:
    prestart = Prestart()
    server = _held_server(tmp_path)
    assert prestart.hold(server) and server.held
    try:
        _wait_held(server)
        with prestart.paused() as quiet:
            assert group_stopped(server.pid)  # type: ignore[arg-type]
            time.sleep(0.2)
        check = quiet.check("p")
        assert check is not None and check.passed, check
        assert not group_stopped(server.pid)  # type: ignore[arg-type]  # continued after the point
    finally:
        prestart.close()
    assert server.poll() is not None  # nobody claimed it: stopped


def test_a_pause_that_does_not_stop_fails_the_check(tmp_path: Path) -> None:
    prestart = Prestart(stop_signal=signal.SIGCONT)  # the fault: the "stop" signal stops nothing
    server = _held_server(tmp_path)
    prestart.hold(server)
    try:
        _wait_held(server)
        with prestart.paused() as quiet:
            pass
        check = quiet.check("p")
        assert check is not None and not check.passed and "did not all stop" in check.detail
    finally:
        prestart.close()


def test_ticks_used_during_a_point_fail_the_check(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    proc.mkdir()
    prestart = Prestart(stop_signal=signal.SIGCONT, proc=proc)  # the fake /proc says what ran
    server = _held_server(tmp_path)
    prestart.hold(server)
    pid = server.pid
    assert pid is not None
    try:
        _fake_proc(proc, pid, {pid: ("T", 50, 5)})
        with prestart.paused() as quiet:
            _fake_proc(proc, pid, {pid: ("T", 52, 5)})  # the fault: it ran for two ticks
        check = quiet.check("p")
        assert check is not None and not check.passed and check.value == 2.0
    finally:
        prestart.close()


def test_nothing_held_nothing_checked() -> None:
    with Prestart().paused() as quiet:
        pass
    assert quiet.check("p") is None
    assert Quiet(watched=False).check("p") is None


def test_claim_takes_only_the_same_server(tmp_path: Path) -> None:
    prestart = Prestart()
    held = _held_server(tmp_path)
    prestart.hold(held)
    other = VllmServer(["serve", "other"], command=[sys.executable, "-m", "vllm.entrypoints.cli.main"],
                       startup_timeout_s=5, key_dir=tmp_path / "keys", log_path=tmp_path / "s.log")
    assert prestart.claim(other) is other
    assert held.poll() is not None or _gone_soon(held)  # the held one that was not it: stopped
    again = _held_server(tmp_path)
    prestart.hold(again)
    same = _held_server(tmp_path)
    assert prestart.claim(same) is again and prestart.server is None
    again.stop()


def _gone_soon(server: VllmServer) -> bool:
    deadline = time.monotonic() + 10
    while server.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    return server.poll() is not None


def test_unknown_interpreter_is_not_held(tmp_path: Path) -> None:
    server = VllmServer(["serve", "m"], command=["sh", "-c", "vllm"], startup_timeout_s=5,
                        key_dir=tmp_path / "keys", log_path=tmp_path / "s.log")
    prestart = Prestart()
    assert not prestart.hold(server) and prestart.server is None and server.pid is None
    assert not Prestart(proc=tmp_path / "no-proc").hold(_held_server(tmp_path))  # no /proc: cannot check


def test_held_script_exits_without_go(tmp_path: Path) -> None:
    """Not `go` (or the end of its input): the held script exits 0 without running anything."""
    script = held_script(tmp_path / "keys")
    assert script.read_bytes() == HELD.read_bytes() and script.parent.stat().st_mode & 0o077 == 0
    done = subprocess.run([sys.executable, str(script), "serve", str(tmp_path)], input="stop\n", text=True,
                          capture_output=True, timeout=120, cwd=tmp_path, check=False,
                          env={**os.environ, "PYTHONPATH": ""})
    assert done.returncode == 0, done.stderr
    assert "# studyc-held:" in done.stdout and "waiting" in done.stdout and "go after" not in done.stdout


def test_a_held_start_that_fails_says_it_exited_before_ready(tmp_path: Path) -> None:
    """Let go, the held script here cannot import vLLM (this interpreter has none) and exits: the server reports
    the usual startup failure with its exit code, for the executor to start the launch again, cold, under a
    new id (`runner.execute.launch.run_launch_retried`; tests/runner/test_start_retry.py); the server itself
    is not spawned again."""
    from base.errors import EngineError

    prestart = Prestart()
    server = _held_server(tmp_path)
    prestart.hold(server)
    claimed = prestart.claim(_held_server(tmp_path))
    assert claimed is server and server.exit_code is None
    server.start()
    with pytest.raises(EngineError, match="exited with code"):
        server.wait_ready()
    assert server.exit_code is not None and server.exit_code != 0
    log = server.log_path.read_text()
    assert "# studyc-held: go after" in log
    assert log.count("# studyc: ") == 1  # the held spawn only


def test_paused_check_results_exactly() -> None:
    """Every field of each outcome: the point it belongs to, the ticks used, the 0 threshold, the words."""
    ok = paused_check("s/a/w/c1/r1", True, {5: 10}, {5: 10})
    assert (ok.point_id, ok.name, ok.passed, ok.severity, ok.value, ok.threshold) == (
        "s/a/w/c1/r1", CHECK, True, "fail", 0.0, 0.0)
    assert ok.detail == "the held next server (1 process(es)) stayed stopped through the point"
    gone = paused_check("p", True, {5: 10, 6: 3}, {5: 10})
    assert gone.value == -3.0 and gone.detail == (
        "the held next server's processes changed during the point (2 -> 1)")
    assert paused_check("p", False, {5: 1}, {5: 1}).detail == "the held next server's processes did not all stop"
    used = paused_check("p", True, {5: 10}, {5: 12})
    assert used.detail == "the held next server used 2 CPU tick(s) during the point" and used.threshold == 0.0


def test_quiet_check_names_its_point() -> None:
    quiet = Quiet(stopped=True, before={1: 0}, after={1: 0}, watched=True)
    check = quiet.check("s/a/w/c2/r1")
    assert check is not None and check.point_id == "s/a/w/c2/r1" and check.passed


def test_close_forgets_the_held_server(tmp_path: Path) -> None:
    prestart = Prestart()
    prestart.hold(_held_server(tmp_path))
    prestart.close()
    assert prestart.server is None
    prestart.close()  # nothing held: nothing to do


def test_a_held_start_imports_the_engine_cores_modules_only_when_it_will_be_forked(tmp_path: Path) -> None:
    """With VLLM_WORKER_MULTIPROC_METHOD=fork the engine core inherits what the held process imported, so the
    engine core's modules are imported too; spawned (vLLM's CLI default) it would import them anew."""
    from runner.server.held import ENGINE_CORE_MODULES, MODULES, modules

    assert modules({}) == list(MODULES)
    assert modules({"VLLM_WORKER_MULTIPROC_METHOD": "spawn"}) == list(MODULES)
    assert modules({"VLLM_WORKER_MULTIPROC_METHOD": "fork"}) == [*MODULES, *ENGINE_CORE_MODULES]
    script = held_script(tmp_path / "keys")
    counts = []
    for method in ("spawn", "fork"):
        done = subprocess.run([sys.executable, str(script), "serve", str(tmp_path)], input="stop\n", text=True,
                              capture_output=True, timeout=120, cwd=tmp_path, check=False,
                              env={**os.environ, "PYTHONPATH": "", "VLLM_WORKER_MULTIPROC_METHOD": method})
        found = re.search(r"(\d+) modules imported in [\d.]+ s \(skipped: (\d+)\)", done.stdout)
        assert done.returncode == 0 and found, done.stdout + done.stderr
        counts.append(int(found.group(1)) + int(found.group(2)))  # what the held process tried
    assert counts == [len(MODULES), len(MODULES) + len(ENGINE_CORE_MODULES)]


def test_hold_first_waits_for_the_imports_then_is_claimed(tmp_path: Path) -> None:
    """The run's first launch: spawned held and waited for until the held script says its imports are done
    (here every import is skipped, so the line comes soon); it stays held, alive, marked first, and is
    the server its launch claims. A later `hold` (the next launch's) is not first."""
    prestart = Prestart()
    assert prestart.first is False  # nothing held yet
    server = _held_server(tmp_path)
    waited = prestart.hold_first(server, timeout_s=60)
    assert waited is not None and 0.0 < waited < 60
    assert "modules imported in" in server.log_tail(5) and server.poll() is None and server.held
    assert prestart.first and prestart.claim(_held_server(tmp_path)) is server
    server.stop()
    nxt = _held_server(tmp_path)
    assert prestart.hold(nxt) and prestart.first is False
    prestart.close()


def test_hold_first_stops_waiting_at_its_timeout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A held server whose imported line never comes: the wait ends at `timeout_s`, the server still held."""
    import runner.execute.prestart as prestart_module

    monkeypatch.setattr(prestart_module, "IMPORTED", "a line the held script never prints")
    prestart = Prestart()
    server = _held_server(tmp_path)
    waited = prestart.hold_first(server, timeout_s=1.0)
    assert waited is not None and 1.0 <= waited < 5.0 and server.poll() is None
    prestart.close()


def test_hold_first_stops_waiting_when_the_server_exits(tmp_path: Path) -> None:
    """A held spawn that exits before importing (an interpreter that is not Python) ends the wait at once;
    claimed, it is started again cold (test_a_held_start_that_fails_is_started_again_cold)."""
    server = VllmServer(["serve", "m"], command=["/bin/false", "-m", "vllm.entrypoints.cli.main"],
                        startup_timeout_s=5, key_dir=tmp_path / "keys", log_path=tmp_path / "s.log")
    waited = Prestart().hold_first(server, timeout_s=30)
    assert waited is not None and waited < 10 and server.poll() is not None


def test_hold_first_none_when_it_cannot_hold(tmp_path: Path) -> None:
    server = VllmServer(["serve", "m"], command=["sh", "-c", "vllm"], startup_timeout_s=5,
                        key_dir=tmp_path / "keys", log_path=tmp_path / "s.log")
    prestart = Prestart()
    assert prestart.hold_first(server, timeout_s=5) is None
    assert prestart.server is None and not prestart.first and server.pid is None

"""The per-launch calibration of the machine metrics, without a GPU: `run_launch` with a fake calibrator (the
only fake: it makes a calibration succeed or fail on demand) in front of a server whose engine command is
`false`, so the start fails at once, as a real failed start does. The calibration runs before the server
starts, its seconds go to the "calibration" phase, its values (or NULLs and the reason) onto the server's row,
and a calibration that fails leaves the launch going on to its start."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from base.errors import EngineError
from compiler.load import load_study
from compiler.plan import Launch
from compiler.plan_compile import compile_study
from compiler.study import Checks
from runner.execute.driver import RunOptions
from runner.execute.launch import LaunchSpec, PhaseEvent, ServerEvent, run_launch
from runner.execute.machine import calibrate_servers, with_calibration
from runner.execute.point import PointContext
from runner.execute.run import _spec
from runner.measure.calibrate import Calibration
from runner.server.placement import Placement
from runner.store.records import ServerRecord

ROOT = Path(__file__).resolve().parents[2]
GOOD = Calibration(True, 4.2e12, 6.5e14, "NVIDIA H200", {}, None)
BAD = Calibration(False, None, None, None, {}, "calibration probe reported failure: no CUDA device")


class Calibrator:
    """Answers `answer` (or raises it), and records every call's arguments."""

    def __init__(self, answer: Calibration | Exception) -> None:
        self.answer, self.calls = answer, []  # type: list[tuple[list[str], int]]

    def __call__(self, python_cmd: list[str], *, gpu_index: int = 0, **_: Any) -> Calibration:
        self.calls.append((list(python_cmd), gpu_index))
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


def machine_launch(tmp: Path) -> Launch:
    plan = compile_study(load_study(ROOT / "studies/the_machine.toml"))
    assert plan.calibrate_launches
    return plan.launches[0].model_copy(update={"model_dir": str(tmp)})  # no config.json: no tokenizer written


def spec(tmp: Path, *, devices: tuple[tuple[str, ...], ...] = (("1",),), gpu_host: bool = True,
         **more: Any) -> LaunchSpec:
    launch = machine_launch(tmp)
    ctx = PointContext(thresholds=Checks(), client_ceiling_chunks_per_s=None, gpu_index=0, clock_origin_s=0.0)
    return LaunchSpec(launch=launch, points=launch.points, run_id="run-1",
                      placement=Placement(launch.id, 0, devices, None), ctx=ctx, engine_command=("false",),
                      log_dir=tmp / "logs", key_dir=tmp / "keys", startup_timeout_s=30.0, gpu_host=gpu_host,
                      **more)


def launch_events(launch_spec: LaunchSpec, calibrator: Calibrator) -> list[Any]:
    events: list[Any] = []
    with pytest.raises(EngineError, match="exited with code 1"):  # `false` as the engine: the start fails
        run_launch(launch_spec, events.append, calibrator=calibrator)
    return events


def test_a_launch_calibrates_its_gpu_before_its_server_starts(tmp_path: Path) -> None:
    fake = Calibrator(GOOD)
    events = launch_events(spec(tmp_path, calibrate_python=("py", "-X")), fake)
    assert fake.calls == [(["py", "-X"], 1)]  # the engine python, on the server's own GPU
    assert isinstance(events[0], PhaseEvent) and events[0].phases[0][0] == "calibration"
    starting = events[1]
    assert isinstance(starting, ServerEvent) and starting.record.status is None  # the row before the start
    assert starting.starting and not any(e.starting for e in events[2:] if isinstance(e, ServerEvent))
    assert (starting.record.machine_flops, starting.record.machine_bandwidth) == (6.5e14, 4.2e12)
    assert "calibrated: 4.200 TB/s, 650 TFLOP/s" in starting.status
    failed = next(e for e in events if isinstance(e, ServerEvent) and e.record.status == "failed")
    assert failed.record.machine_flops == 6.5e14 and failed.record.metric("ridge_point") == pytest.approx(154.76, 1e-3)


@pytest.mark.parametrize("answer", [BAD, RuntimeError("probe crashed")])
def test_a_calibration_that_fails_stores_nulls_and_the_launch_goes_on(tmp_path: Path,
                                                                       answer: Calibration | Exception) -> None:
    events = launch_events(spec(tmp_path, calibrate_python=("py",)), Calibrator(answer))
    rows = [e.record for e in events if isinstance(e, ServerEvent)]
    assert [r.status for r in rows] == [None, "failed"]  # the server was still started (and failed on its own)
    for row in rows:
        assert row.machine_flops is None and row.machine_bandwidth is None and row.metric("ridge_point") is None
        assert row.calibration_error is not None and row.calibration_error.startswith("not calibrated: ")
    reason = rows[0].calibration_error or ""
    assert ("no CUDA device" in reason) if isinstance(answer, Calibration) else ("RuntimeError: probe crashed" in reason)


def test_a_plan_that_does_not_ask_calibrates_nothing(tmp_path: Path) -> None:
    fake = Calibrator(GOOD)
    events = launch_events(spec(tmp_path), fake)
    assert fake.calls == [] and not any(isinstance(e, PhaseEvent) and e.phases[0][0] == "calibration" for e in events)
    assert all(e.record.machine_flops is None and e.record.calibration_error is None
               for e in events if isinstance(e, ServerEvent))


def test_no_calibrate_is_stored_as_the_reason(tmp_path: Path) -> None:
    fake = Calibrator(GOOD)
    events = launch_events(spec(tmp_path, calibration_skipped="skipped (--no-calibrate)"), fake)
    assert fake.calls == []
    assert {e.record.calibration_error for e in events if isinstance(e, ServerEvent)} == {"skipped (--no-calibrate)"}


def test_replicas_calibrate_each_gpu_once() -> None:
    rows = [ServerRecord("run-1", f"s{k}") for k in range(3)]
    fake = Calibrator(GOOD)
    out, seconds = calibrate_servers(rows, [0, 1, 0], ("py",), fake)
    assert [c[1] for c in fake.calls] == [0, 1] and seconds >= 0
    assert all(r.machine_flops == 6.5e14 for r in out)
    cpu, _ = calibrate_servers(rows[:1], [None], ("py",), Calibrator(BAD))  # a CPU host: GPU 0, as the run's own
    assert cpu[0].machine_flops is None and "no CUDA device" in (cpu[0].calibration_error or "")


def test_a_zero_bandwidth_is_not_a_calibration() -> None:
    row = with_calibration(ServerRecord("r", "s"), replace(GOOD, bandwidth_Bps=0.0))
    assert row.machine_bandwidth is None and row.calibration_error


def test_the_run_asks_for_it_only_when_the_plan_does(tmp_path: Path) -> None:
    launch = machine_launch(tmp_path)
    placed = Placement(launch.id, 0, (("0",),), None)
    ctx = PointContext(thresholds=Checks(), client_ceiling_chunks_per_s=None, gpu_index=0, clock_origin_s=0.0)
    options = RunOptions(db=tmp_path / "r.duckdb", engine_command=["vllm"], python_argv=["/venv/python"],
                         runs_dir=tmp_path)

    def made(opts: RunOptions, asked: bool) -> LaunchSpec:
        return _spec(launch, launch.points, placed, ctx, "run-1", opts, True, (launch.id,), asked)

    assert (made(options, True).calibrate_python, made(options, True).calibration_skipped) == (("/venv/python",), "")
    assert (made(options, False).calibrate_python, made(options, False).calibration_skipped) == ((), "")
    skipped = made(replace(options, calibrate=False), True)
    assert (skipped.calibrate_python, skipped.calibration_skipped) == ((), "skipped (--no-calibrate)")


# -- the pure parts, at their edges ---------------------------------------------------------------------------


def test_a_calibrator_that_raises_reads_as_not_calibrated() -> None:
    from runner.execute.machine import calibrate_device

    cal = calibrate_device(["py"], 3, Calibrator(RuntimeError("probe died")))
    assert cal.calibrated is False and (cal.flops_bf16, cal.bandwidth_Bps) == (None, None)
    assert cal.reason == "calibration raised RuntimeError: probe died"
    assert calibrate_device(["py"], 3, Calibrator(GOOD)) is GOOD


def test_only_positive_flops_and_bandwidth_are_a_calibration() -> None:
    row = ServerRecord(run_id="r", server_id="s", calibration_error="left over")
    good = with_calibration(row, GOOD)
    assert (good.machine_flops, good.machine_bandwidth, good.calibration_error) == (6.5e14, 4.2e12, None)
    for flops, bandwidth in ((0.0, 4.2e12), (-1.0, 4.2e12), (6.5e14, -1.0), (None, 4.2e12)):
        cal = Calibration(True, bandwidth, flops, "GPU", {}, None)
        bad = with_calibration(row, cal)
        assert (bad.machine_flops, bad.machine_bandwidth) == (None, None), (flops, bandwidth)
        assert bad.calibration_error == "not calibrated: calibration returned no positive FLOP/s and bandwidth"
    assert with_calibration(good, BAD).calibration_error == (
        "not calibrated: calibration probe reported failure: no CUDA device")
    assert with_calibration(good, BAD).machine_flops is None


def test_calibrate_servers_pairs_every_row_with_its_device_and_times_itself() -> None:
    import time

    from runner.execute.machine import calibration_note

    rows = [ServerRecord(run_id="r", server_id=f"s{i}") for i in range(2)]

    class Slow(Calibrator):
        def __call__(self, python_cmd: list[str], *, gpu_index: int = 0, **_: Any) -> Calibration:
            time.sleep(0.05)
            return super().__call__(python_cmd, gpu_index=gpu_index)

    fake = Slow(GOOD)
    out, seconds = calibrate_servers(rows, [None, 2], ["py"], fake)
    assert fake.calls == [(["py"], 0), (["py"], 2)]  # no device: GPU 0, as the run's own calibration
    assert 0.1 <= seconds < 5
    with pytest.raises(ValueError):
        calibrate_servers(rows, [0], ["py"], fake)  # a row without its device is a caller's error
    assert calibration_note(out) == "calibrated: 4.200 TB/s, 650 TFLOP/s"  # one note for the same values
    half = replace(out[1], machine_bandwidth=None, calibration_error=None)
    assert calibration_note([half]) == "calibrated: not calibrated"
    assert calibration_note([with_calibration(rows[0], BAD), out[0]]) == (
        "calibrated: not calibrated: calibration probe reported failure: no CUDA device; 4.200 TB/s, 650 TFLOP/s")
    small = replace(out[0], machine_bandwidth=1.5e12, machine_flops=1.5e12)
    assert calibration_note([small]) == "calibrated: 1.500 TB/s, 2 TFLOP/s"

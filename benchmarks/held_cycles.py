"""Do held starts survive being stopped and continued? Held starts as a run makes them, counted.

A run spawns the next launch's server held after its imports (`runner/server/held.py`) and stops its process
group (SIGSTOP) for every point of the launch before, continuing it (SIGCONT) between points; then it lets
it go. Once (2026-12-05, an H100) a held start died at `go`: "Intel oneMKL FATAL ERROR: Cannot load
libtorch_cpu.so". This spawns `--starts` held servers one after another, stops and continues each one
`--cycles` times while it is held (`--stopped-s` stopped, `--running-s` between), lets it go and waits for
/health, and counts the starts that fail, with the line of their log that says why. `--no-cycles` holds
without stopping, the control. Default: the repo's tiny model on the CPU server.

    .venv/bin/python benchmarks/held_cycles.py --starts 8 --cycles 5
    python3 benchmarks/held_cycles.py --engine "python3 -m vllm.entrypoints.cli.main" \
        --model models/qwen3-0.6b --serve-args "--load-format dummy --max-model-len 4096" --starts 6
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from base.errors import EngineError  # noqa: E402
from base.settings import load_settings  # noqa: E402
from runner.server.engine import VllmServer, engine_python  # noqa: E402
from runner.server.tokenizer import ensure_tokenizer  # noqa: E402

CPU_SERVE = ("--load-format dummy --max-model-len 2048 --max-num-seqs 16 --kv-cache-memory-bytes 256M "
             "--block-size 32 --enforce-eager --distributed-executor-backend uni")
WHY = ("FATAL", "Error", "error:", "Cannot load", "Traceback")


def held_start(argv: list[str], command: list[str], folder: Path, name: str, env: dict[str, str], cycles: int,
               stopped_s: float, running_s: float) -> dict[str, object]:
    """One held start through `cycles` stop/continue cycles: ok, seconds from `go` to ready, or why not."""
    python = engine_python(command)
    if python is None:
        raise SystemExit(f"{shlex.join(command)}: its interpreter cannot be told, so it cannot be held")
    server = VllmServer(argv, command=command, startup_timeout_s=900, key_dir=folder, env=env,
                        log_path=folder / f"{name}.log")
    try:
        server.hold(python, folder)
        while "waiting" not in server.log_path.read_text(errors="replace"):
            if server.poll() is not None:
                return {"start": name, "ok": False, "at": "held", "why": _why(server.log_path)}
            time.sleep(0.1)
        for _ in range(cycles):
            server.pause()
            time.sleep(stopped_s)
            server.resume()
            time.sleep(running_s)
        server.start()
        try:
            info = server.wait_ready()
        except EngineError:
            return {"start": name, "ok": False, "at": "go", "exit": server.exit_code, "why": _why(server.log_path)}
        return {"start": name, "ok": True, "ready_s": round(info.startup_s, 1)}
    finally:
        server.stop()


def _why(log: Path) -> str:
    lines = log.read_text(errors="replace").splitlines()
    return next((line for line in lines if any(w in line for w in WHY)), lines[-1] if lines else "")[:300]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engine", default=None, help="engine command (default: STUDYC_VLLM)")
    ap.add_argument("--model", default="models/tiny-qwen3")
    ap.add_argument("--serve-args", default=CPU_SERVE)
    ap.add_argument("--starts", type=int, default=8)
    ap.add_argument("--cycles", type=int, default=5)
    ap.add_argument("--stopped-s", type=float, default=3.0)
    ap.add_argument("--running-s", type=float, default=0.5)
    ap.add_argument("--no-cycles", action="store_true", help="hold without stopping (the control)")
    ap.add_argument("--json", default=None, help="write every start here")
    args = ap.parse_args()
    command = shlex.split(args.engine) if args.engine else list(load_settings().vllm_argv)
    model = str((REPO / args.model).resolve()) if not Path(args.model).is_absolute() else args.model
    ensure_tokenizer(model)
    argv = ["serve", model, *shlex.split(args.serve_args)]
    env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"} if "--enforce-eager" in args.serve_args else {}
    cycles = 0 if args.no_cycles else args.cycles
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.starts):
            row = held_start(argv, command, Path(tmp), f"s{i + 1}", env, cycles, args.stopped_s, args.running_s)
            rows.append(row)
            print(json.dumps(row), flush=True)
    failed = [r for r in rows if not r["ok"]]
    print(f"held starts: {len(rows)}, each stopped and continued {cycles} time(s) while held; failed: {len(failed)}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()

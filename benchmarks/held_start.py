"""How much a held start saves: cold starts and held starts of one server configuration, alternating.

A cold start spawns `vllm serve` and waits for /health. A held start spawns the same server held after its
API process's imports (`runner/server/held.py`), waits until it is held (the part a run overlaps with the
launch before), then lets it go and waits for /health: only the time from `go` counts. Each round runs one
of each, in alternating order, so drift on the host falls on both. Printed: every start, the medians, and
held / cold. Default: the repo's tiny model on the CPU server (about 1 minute a round on 2 cores).

    .venv/bin/python benchmarks/held_start.py --rounds 3
    .venv/bin/python benchmarks/held_start.py --engine "python3 -m vllm.entrypoints.cli.main" \
        --model models/qwen3-8b --serve-args "--load-format dummy --max-model-len 4096" --gpu-index 0
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from base.settings import load_settings  # noqa: E402
from runner.server.engine import VllmServer, engine_python  # noqa: E402
from runner.server.tokenizer import ensure_tokenizer  # noqa: E402

CPU_SERVE = ("--load-format dummy --max-model-len 2048 --max-num-seqs 16 --kv-cache-memory-bytes 256M "
             "--block-size 32 --enforce-eager --distributed-executor-backend uni")


def start(argv: list[str], command: list[str], folder: Path, name: str, held: bool, env: dict[str, str]) -> float:
    """Seconds from the start (a held one: from `go`) to /health, the server stopped after."""
    server = VllmServer(argv, command=command, startup_timeout_s=900, key_dir=folder, env=env,
                        log_path=folder / f"{name}.log")
    try:
        if held:
            python = engine_python(command)
            if python is None:
                raise SystemExit(f"{shlex.join(command)}: its interpreter cannot be told, so it cannot be held")
            server.hold(python, folder)
            while "waiting" not in server.log_path.read_text(errors="replace"):
                if server.poll() is not None:
                    raise SystemExit(f"the held server exited: see {server.log_path}")
                time.sleep(0.1)
        server.start()
        return server.wait_ready().startup_s
    finally:
        server.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engine", default=None, help="engine command (default: STUDYC_VLLM)")
    ap.add_argument("--model", default="models/tiny-qwen3")
    ap.add_argument("--serve-args", default=CPU_SERVE)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--gpu-index", type=int, default=None, help="CUDA_VISIBLE_DEVICES for the server")
    ap.add_argument("--kinds", default="cold,held",
                    help="starts to alternate: cold, held, and either with -fork (the engine core forked from "
                         "the API process, VLLM_WORKER_MULTIPROC_METHOD=fork, instead of spawned)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    kinds = args.kinds.split(",")
    command = shlex.split(args.engine) if args.engine else list(load_settings().vllm_argv)
    model = str((REPO / args.model).resolve())
    if Path(model, "config.json").is_file():
        ensure_tokenizer(Path(model))
    argv = ["serve", model, *shlex.split(args.serve_args)]
    env = {"CUDA_VISIBLE_DEVICES": str(args.gpu_index)} if args.gpu_index is not None else {}
    times: dict[str, list[float]] = {kind: [] for kind in kinds}
    with tempfile.TemporaryDirectory(prefix="held-start-") as tmp:
        folder = Path(tmp)
        os.chmod(folder, 0o700)
        for r in range(args.rounds):
            order = kinds[r % len(kinds):] + kinds[:r % len(kinds)]  # each kind first in turn
            for kind in order:
                fork = {"VLLM_WORKER_MULTIPROC_METHOD": "fork"} if kind.endswith("-fork") else {}
                s = start(argv, command, folder, f"{kind}{r}", kind.startswith("held"), {**env, **fork})
                times[kind].append(s)
                print(f"round {r + 1} {kind}: ready in {s:.1f} s", flush=True)
    medians = {kind: statistics.median(t) for kind, t in times.items()}
    base = medians[kinds[0]]
    print(f"median of {args.rounds}: " + ", ".join(f"{k} {m:.1f} s ({m / base:.2f} of {kinds[0]})"
                                                   for k, m in medians.items()) + " (held: from go)")
    if args.json:
        args.json.write_text(json.dumps({"times": times, "medians_s": medians}, indent=1))


if __name__ == "__main__":
    main()

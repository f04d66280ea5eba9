"""Does sampling the server during measured requests change what is measured?

Against one real vLLM server, blocks of requests are interleaved: in every block, for every
condition (in rotated order), a batch of unmeasured requests with no sampling (the warmup-style
reference) and then a batch of measured requests with the condition's sampling on:

- none:     nothing sampled
- poller:   GET /metrics every 0.25 s (runner.measure.prometheus.MetricsPoller, as a point ran it)
- nvml:     NVML every 0.1 s (runner.measure.nvml.NvmlSampler; absent on a CPU host, then skipped)
- both:     poller and NVML

Printed per condition: token gaps, ITL p50/p95/p99, TPOT p50/p99 (per request), the share of
gaps over 2x the median gap, and each figure's ratio to `none`; the same for the unmeasured
reference. Default: the repo's tiny model on the CPU server (about 2-3 minutes on 2 cores).

    .venv/bin/python benchmarks/telemetry_disturbance.py
    .venv/bin/python benchmarks/telemetry_disturbance.py --engine "vllm" --model models/qwen3-0.6b \
        --serve-args "--max-model-len 4096" --input-len 128 --output-len 512 --concurrency 1 \
        --requests 8 --blocks 6 --gpu-index 0 --client-cpus none
    .venv/bin/python benchmarks/telemetry_disturbance.py --base-url http://127.0.0.1:8000 --model M
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from base.settings import load_settings  # noqa: E402
from runner.load.loadgen import RequestSpec, make_prompts, run_load  # noqa: E402
from runner.measure import prometheus  # noqa: E402
from runner.measure.nvml import NvmlSampler  # noqa: E402

CONDITIONS = ("none", "poller", "nvml", "both")
CPU_SERVE = ("--load-format dummy --max-model-len 2048 --max-num-seqs 16 --kv-cache-memory-bytes 256M "
             "--block-size 32 --enforce-eager --distributed-executor-backend uni")


def _pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def _stats(records: list[Any]) -> dict[str, float]:
    gaps = [b - a for r in records if r.ok for a, b in zip(r.token_times_s, r.token_times_s[1:], strict=False)]
    tpot = [(r.token_times_s[-1] - r.token_times_s[0]) / (len(r.token_times_s) - 1)
            for r in records if r.ok and len(r.token_times_s) > 1]
    med = statistics.median(gaps) if gaps else float("nan")
    return {
        "gaps": float(len(gaps)),
        "itl_p50_ms": _pct(gaps, 0.50) * 1e3, "itl_p95_ms": _pct(gaps, 0.95) * 1e3,
        "itl_p99_ms": _pct(gaps, 0.99) * 1e3, "itl_max_ms": max(gaps, default=float("nan")) * 1e3,
        "tpot_p50_ms": _pct(tpot, 0.5) * 1e3, "tpot_p99_ms": _pct(tpot, 0.99) * 1e3,
        "slow_gap_share": sum(g > 2 * med for g in gaps) / len(gaps) if gaps else float("nan"),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engine", default=os.environ.get("STUDYC_VLLM", str(REPO / ".venv-vllm/bin/vllm")))
    ap.add_argument("--model", default=str(REPO / "models/tiny-qwen3"))
    ap.add_argument("--serve-args", default=None, help=f"extra `vllm serve` flags (CPU default: {CPU_SERVE})")
    ap.add_argument("--base-url", default=None, help="use a running server instead of starting one")
    ap.add_argument("--api-key", default=None)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--requests", type=int, default=4, help="requests per batch (each block: 2 per condition)")
    ap.add_argument("--blocks", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=4096, help="token ids are drawn from [4, vocab)")
    ap.add_argument("--gpu-index", type=int, default=0)
    ap.add_argument("--client-cpus", default="1", help="comma list, or 'none' (default 1: off core 0)")
    ap.add_argument("--json", default=None, help="write the table here")
    args = ap.parse_args()
    cpus = None if args.client_cpus == "none" else tuple(int(c) for c in args.client_cpus.split(","))

    with ExitStack() as stack:
        if args.base_url:
            base, key = args.base_url, args.api_key
        else:
            from runner.server.engine import VllmServer
            from runner.server.tokenizer import ensure_tokenizer

            if Path(args.model).joinpath("config.json").exists() and "tiny" in Path(args.model).name:
                ensure_tokenizer(Path(args.model))
            serve = args.serve_args if args.serve_args is not None else CPU_SERVE
            env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"} if args.serve_args is None else {}
            log = Path(tempfile.mkdtemp(prefix="disturbance-")) / "server.log"
            server = stack.enter_context(VllmServer(
                ["serve", args.model, *shlex.split(serve)], env=env, log_path=log,
                command=shlex.split(args.engine), startup_timeout_s=900, key_dir=load_settings().cache_path))
            base, key = server.base_url, server.api_key
            print(f"server up at {base} (log {log})", file=sys.stderr)

        probe = NvmlSampler(args.gpu_index)
        probe.start()
        has_nvml = probe.available
        probe.stop()
        conds = [c for c in CONDITIONS if has_nvml or c in ("none", "poller")]
        if not has_nvml:
            print("NVML: not available on this host (" + "; ".join(probe.warnings)[:120]
                  + "): nvml and both conditions skipped", file=sys.stderr)

        salt = iter(range(10**6))

        def batch() -> list[RequestSpec]:
            prompts = make_prompts(args.requests, args.input_len, vocab_lo=4, vocab_hi=args.vocab, seed=11,
                                   salt=f"b{next(salt)}")
            return [RequestSpec(p, args.output_len) for p in prompts]

        def load(specs: list[RequestSpec]) -> list[Any]:
            res = run_load(base, args.model, specs, api_key=key, concurrency=args.concurrency, cpus=cpus)
            return list(res.measured)

        load(batch())  # warm the engine and the client
        measured: dict[str, list[Any]] = {c: [] for c in conds}
        reference: dict[str, list[Any]] = {c: [] for c in conds}
        polls = 0
        for b in range(args.blocks):
            order = conds[b % len(conds):] + conds[:b % len(conds)]
            for c in order:
                reference[c] += load(batch())
                with ExitStack() as samplers:
                    poller = None
                    if c in ("poller", "both"):
                        poller = samplers.enter_context(prometheus.MetricsPoller(base, key, interval_s=0.25))
                    if c in ("nvml", "both"):
                        samplers.enter_context(NvmlSampler(args.gpu_index))
                    measured[c] += load(batch())
                if poller is not None:
                    polls += len(poller.samples)

    rows = {f"{c} measured": _stats(measured[c]) for c in conds}
    rows["all unmeasured"] = _stats([r for c in conds for r in reference[c]])
    base_row = rows["none measured"]
    keys = ("itl_p50_ms", "itl_p95_ms", "itl_p99_ms", "itl_max_ms", "tpot_p50_ms", "tpot_p99_ms")
    print(f"\n{args.model}: {args.input_len} in / {args.output_len} out, c{args.concurrency}, "
          f"{args.blocks} blocks x {args.requests} requests per batch; {polls} /metrics scrapes in measured batches")
    head = f"{'condition':<18}{'gaps':>7}" + "".join(f"{k[:-3]:>11}" for k in keys) + f"{'slow>2xmed':>11}"
    print(head + "   (ms; ratio to `none measured` below)")
    for name, r in rows.items():
        print(f"{name:<18}{int(r['gaps']):>7}" + "".join(f"{r[k]:>11.3f}" for k in keys)
              + f"{r['slow_gap_share']:>11.2%}")
    for name, r in rows.items():
        if name == "none measured":
            continue
        print(f"{name + ' / none':<25}" + "".join(f"{r[k] / base_row[k]:>11.3f}" for k in keys))
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "nvml": has_nvml, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

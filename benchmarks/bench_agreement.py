"""studyc's load generator against `vllm bench serve`, on the same server, same shape, same sampling.

One server is started (studyc's own lifecycle: 127.0.0.1, random API key, dev mode for the cache
reset). Then, in blocks whose order alternates, each level is measured by studyc's client and by
`vllm bench serve --temperature 0 --ignore-eos` (random dataset of the same input/output lengths),
with the prefix cache reset before every measurement. Both compute the same definitions:
output throughput = output tokens / (first send .. last end), TPOT = (end - first token) /
(output tokens - 1) per request, ITL = gaps between content chunks. The table gives each side's
median over blocks and the ratio studyc / bench.

    python benchmarks/bench_agreement.py --model-dir models/tiny-qwen3 --levels 1,4 --requests 8,16 \
        --input-len 64 --output-len 64 --blocks 2 --engine-arg=--max-model-len=512 ...

On the CPU, pass the CPU engine settings with --engine-arg (see studies/quickstart.toml).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from base.settings import load_settings
from runner.checks.cache import reset
from runner.checks.stats import percentile
from runner.load.loadgen import RequestSpec, make_prompts, run_load
from runner.server.engine import VllmServer
from runner.server.tokenizer import ensure_tokenizer

METRICS = ("output_tok_s", "tpot_mean_ms", "itl_p50_ms", "itl_p99_ms")


def studyc_point(base_url: str, api_key: str, model: str, c: int, n: int, input_len: int, output_len: int,
                 vocab: tuple[int, int], seed: int) -> dict[str, float]:
    prompts = make_prompts(n, input_len, vocab_lo=vocab[0], vocab_hi=vocab[1], seed=seed, salt="agreement")
    specs = [RequestSpec(prompt_ids=p, max_tokens=output_len) for p in prompts]
    result = run_load(base_url, model, specs, api_key=api_key, concurrency=c)
    ok = [r for r in result.measured if r.ok]
    if len(ok) != n:
        raise SystemExit(f"studyc: {n - len(ok)} of {n} requests failed at c={c}")
    span = max(r.end_s for r in ok) - min(r.sent_s for r in ok)
    tpot = [(r.end_s - r.first_token_s) / (r.output_tokens - 1) for r in ok
            if r.first_token_s is not None and r.output_tokens > 1]
    itl = [b - a for r in ok for a, b in zip(r.token_times_s, r.token_times_s[1:], strict=False)]
    return {
        "output_tok_s": sum(r.output_tokens for r in ok) / span,
        "tpot_mean_ms": 1e3 * statistics.fmean(tpot),
        "itl_p50_ms": 1e3 * (percentile(itl, 50) or 0.0),
        "itl_p99_ms": 1e3 * (percentile(itl, 99) or 0.0),
    }


def bench_point(engine: list[str], base_url: str, api_key: str, model: str, model_dir: str, c: int, n: int,
                input_len: int, output_len: int, seed: int, workdir: Path) -> dict[str, float]:
    name = f"bench-c{c}-s{seed}.json"
    argv = [*engine, "bench", "serve", "--backend", "vllm", "--base-url", base_url, "--model", model,
            "--tokenizer", model_dir, "--dataset-name", "random", "--random-input-len", str(input_len),
            "--random-output-len", str(output_len), "--random-range-ratio", "0", "--ignore-eos",
            "--temperature", "0", "--max-concurrency", str(c), "--num-prompts", str(n), "--seed", str(seed),
            "--percentile-metrics", "ttft,tpot,itl", "--metric-percentiles", "50,99", "--disable-tqdm",
            "--save-result", "--result-dir", str(workdir), "--result-filename", name]
    env = dict(os.environ, OPENAI_API_KEY=api_key)
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=1800)
    path = workdir / name
    if done.returncode != 0 or not path.exists():
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-15:])
        raise SystemExit(f"vllm bench serve failed (exit {done.returncode}):\n{tail}")
    doc = json.loads(path.read_text())
    if int(doc.get("completed", 0)) != n:
        raise SystemExit(f"vllm bench serve: {doc.get('completed')} of {n} requests completed at c={c}")
    return {
        "output_tok_s": float(doc["output_throughput"]),
        "tpot_mean_ms": float(doc["mean_tpot_ms"]),
        "itl_p50_ms": float(doc["median_itl_ms"]),
        "itl_p99_ms": float(doc["p99_itl_ms"]),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--served-name", default="agreement")
    ap.add_argument("--engine", default=os.environ.get("STUDYC_VLLM", "vllm"), help="command that starts vLLM")
    ap.add_argument("--engine-arg", action="append", default=[], help="extra `vllm serve` argument (repeat)")
    ap.add_argument("--levels", default="1,32", help="concurrencies, comma separated")
    ap.add_argument("--requests", default="8,64", help="requests per level, comma separated")
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=512)
    ap.add_argument("--blocks", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--json", type=Path, help="write every measurement here")
    ap.add_argument("--log", type=Path, default=Path(tempfile.gettempdir()) / "bench_agreement_server.log")
    args = ap.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    counts = [int(x) for x in args.requests.split(",")]
    if len(counts) == 1:
        counts *= len(levels)
    engine = shlex.split(args.engine)
    ensure_tokenizer(args.model_dir)  # vLLM and `vllm bench serve` both read the model folder's tokenizer
    config = json.loads(Path(args.model_dir, "config.json").read_text())
    vocab = (16, max(32, int(int(config["vocab_size"]) * 0.9)))  # the plan's prompt-id range
    argv = ["serve", args.model_dir, "--load-format", "dummy", "--served-model-name", args.served_name,
            "--seed", "0", *args.engine_arg]
    workdir = Path(tempfile.mkdtemp(prefix="bench-agreement-"))
    rows: list[dict[str, object]] = []
    with VllmServer(argv, env={"VLLM_SERVER_DEV_MODE": "1"}, log_path=args.log, command=engine,
                    startup_timeout_s=900.0, gpu_index=0, key_dir=load_settings().cache_path) as server:
        info = server.wait_ready()
        print(f"server ready in {info.startup_s:.1f} s (vLLM {info.vllm_version})", flush=True)
        key = server.api_key
        warm = make_prompts(args.warmup, args.input_len, vocab_lo=vocab[0], vocab_hi=vocab[1], seed=99, salt="w")
        run_load(server.base_url, args.served_name,
                 [RequestSpec(prompt_ids=p, max_tokens=args.output_len) for p in warm],
                 api_key=key, concurrency=max(levels))
        for block in range(args.blocks):
            order = ("studyc", "bench") if block % 2 == 0 else ("bench", "studyc")
            for c, n in zip(levels, counts, strict=True):
                for client in order:
                    if not reset(server.base_url, key).ok:
                        raise SystemExit("prefix cache reset refused: the measurements would not be cold")
                    seed = 1000 * block + c
                    t0 = time.monotonic()
                    if client == "studyc":
                        found = studyc_point(server.base_url, key, args.served_name, c, n, args.input_len,
                                             args.output_len, vocab, seed)
                    else:
                        found = bench_point(engine, server.base_url, key, args.served_name, args.model_dir, c, n,
                                            args.input_len, args.output_len, seed, workdir)
                    rows.append({"block": block, "client": client, "concurrency": c, "requests": n, **found})
                    print(f"block {block} c={c} {client:6s} " + " ".join(f"{m}={found[m]:.3f}" for m in METRICS)
                          + f" ({time.monotonic() - t0:.1f} s)", flush=True)
    print(f"\n{args.blocks} blocks on one server launch; medians over blocks; ratio = studyc / vllm bench serve")
    print("| c | metric | studyc | vllm bench serve | ratio |\n| --- | --- | --- | --- | --- |")
    worst = 0.0
    for c in levels:
        for m in METRICS:
            ours = statistics.median(float(r[m]) for r in rows if r["concurrency"] == c and r["client"] == "studyc")
            theirs = statistics.median(float(r[m]) for r in rows if r["concurrency"] == c and r["client"] == "bench")
            ratio = ours / theirs if theirs else float("nan")
            worst = max(worst, abs(ratio - 1.0))
            print(f"| {c} | {m} | {ours:,.3f} | {theirs:,.3f} | {ratio:.3f} |")
    print(f"largest disagreement: {100 * worst:.1f}%")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()

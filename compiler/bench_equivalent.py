"""The `vllm bench serve` command that offers the same load as a plan point, and the exact
request body studyc sends. Pure: a point in, text out.

The request body (built in runner/load/loadgen.py, read back by runner/load/sse.py), one POST to
`/v1/completions` per request:

    {"model": SERVED_NAME, "prompt": [token ids], "max_tokens": OUTPUT_LEN, "ignore_eos": true,
     "temperature": 0, "stream": true, "stream_options": {"include_usage": true}}

- Sampling is greedy (`temperature: 0`). `vllm bench serve` samples at temperature 1 unless given
  `--temperature 0` (about 3% slower on an H200, 30% on the CPU server).
- Prompts are lists of token ids, so the server sees exactly `input_len` tokens; the bench's random
  dataset sends text decoded from random ids, which the server re-tokenizes (lengths can drift by a
  few tokens with a BPE tokenizer).
- `ignore_eos: true` gives exactly `max_tokens` tokens; token counts come from the final `usage`
  event (`stream_options.include_usage`), not from counting chunks (a chunk can carry several tokens).
- A token's time is the arrival of the socket read that carried its SSE chunk; the bench stamps
  each chunk after parsing it.
"""

from __future__ import annotations

import shlex
from typing import Protocol

from compiler.workload import Shape, Uniform, length_mean

REQUEST_BODY = {
    "model": "SERVED_NAME",
    "prompt": "[token ids, exactly input_len of them]",
    "max_tokens": "output_len",
    "ignore_eos": True,
    "temperature": 0,
    "stream": True,
    "stream_options": {"include_usage": True},
}


class BenchPoint(Protocol):
    """The fields of a plan point (compiler.plan.PointStep) the command needs."""

    @property
    def concurrency(self) -> int | None: ...
    @property
    def rate_rps(self) -> float | None: ...
    @property
    def requests(self) -> int: ...
    @property
    def warmup(self) -> int: ...
    @property
    def input_len(self) -> int: ...
    @property
    def output_len(self) -> int: ...
    @property
    def prefix_len(self) -> int: ...
    @property
    def prompt_seed(self) -> int: ...
    @property
    def arrival(self) -> str: ...
    @property
    def burstiness(self) -> float: ...


def bench_argv(point: BenchPoint, *, base_url: str, model: str, tokenizer: str | None = None,
               served_name: str | None = None, vllm: str = "vllm", goodput: str = "") -> list[str]:
    """`vllm bench serve` arguments offering the point's load: same lengths, sampling and count; `goodput`:
    the study's [slo] as the bench's `--goodput` pairs (`compiler.slo.Slo.bench_goodput`)."""
    argv = [*shlex.split(vllm), "bench", "serve", "--backend", "vllm", "--endpoint", "/v1/completions",
            "--base-url", base_url, "--model", model, "--tokenizer", tokenizer or model]
    if served_name:
        argv += ["--served-model-name", served_name]
    argv += [
        *_dataset(point),
        "--num-prompts", str(point.requests),
        "--ignore-eos",
        "--temperature", "0",
        "--seed", str(point.prompt_seed),
    ]
    if point.warmup:
        argv += ["--num-warmups", str(point.warmup)]
    if point.rate_rps is None:
        # closed loop: every slot refilled at once
        argv += ["--request-rate", "inf", "--max-concurrency", str(point.concurrency or point.requests)]
    else:
        # studyc's poisson is gamma with shape 1, the bench's default burstiness
        shape = {"poisson": 1.0, "constant": 1000.0}.get(point.arrival, point.burstiness)
        argv += ["--request-rate", f"{point.rate_rps:g}", "--burstiness", f"{shape:g}"]
        if point.concurrency is not None:
            argv += ["--max-concurrency", str(point.concurrency)]
    argv += ["--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,95,99"]
    if goodput:
        argv += ["--goodput", *goodput.split()]
    return argv


def _dataset(point: BenchPoint) -> list[str]:
    """The bench's dataset options: `random` (uniform lengths in [L(1-r), L(1+r)], the same r for input and
    output), `prefix_repetition` for few-shot templates, `timed_trace` for a Mooncake trace."""
    shape: Shape | None = getattr(point, "shape", None)  # a PointStep's; a point without one is classic
    if shape is not None and shape.trace is not None:
        argv = ["--dataset-name", "timed_trace", "--dataset-path", shape.trace.path,
                "--timed-trace-chunk-hash-size", "512", "--timed-trace-sec-multiplier", "0.001"]
        return argv + ([] if shape.trace_arrivals else ["--no-self-timed"])
    if shape is not None and shape.templates > 1 and isinstance(shape.input, int) and isinstance(shape.output, int):
        return ["--dataset-name", "prefix_repetition", "--prefix-repetition-prefix-len", str(point.prefix_len),
                "--prefix-repetition-suffix-len", str(shape.input - point.prefix_len),
                "--prefix-repetition-num-prefixes", str(shape.templates),
                "--prefix-repetition-output-len", str(shape.output)]
    inp, out, ratio = point.input_len, point.output_len, 0.0
    if shape is not None and shape.input is not None and shape.output is not None:
        inp, out = round(length_mean(shape.input)), round(length_mean(shape.output))
        ratios = {_ratio(shape.input), _ratio(shape.output)}
        found = ratios.pop() if len(ratios) == 1 else None  # the bench draws both lengths with one ratio
        ratio = found if found is not None else 0.0
    return ["--dataset-name", "random", "--random-input-len", str(inp - point.prefix_len),
            "--random-prefix-len", str(point.prefix_len), "--random-output-len", str(out),
            "--random-range-ratio", f"{ratio:g}"]


def _ratio(length: object) -> float | None:
    """The bench's range ratio that draws this length: 0 for a fixed one, (max - min) / (max + min) for a
    uniform one; None for any other distribution (no bench equivalent)."""
    if isinstance(length, int):
        return 0.0
    if isinstance(length, Uniform):
        return round((length.max - length.min) / (length.max + length.min), 6)
    return None


def bench_command(point: BenchPoint, *, base_url: str, model: str, tokenizer: str | None = None,
                  served_name: str | None = None, vllm: str = "vllm", goodput: str = "") -> str:
    """The same as one shell line."""
    return shlex.join(bench_argv(point, base_url=base_url, model=model, tokenizer=tokenizer,
                                 served_name=served_name, vllm=vllm, goodput=goodput))


DIFFERENCES = (
    "prompts: studyc sends token-id lists (exact input length); the bench sends text decoded from "
    "random ids, re-tokenized by the server",
    "prefix: studyc's shared prefix comes from its own seed; the bench draws its own",
    "timing: studyc stamps a token at the socket read that carried it; the bench after parsing each chunk",
    "drawn lengths: the bench's random dataset draws both lengths uniformly with one range ratio; normal, "
    "lognormal and histogram lengths, or two different ranges, have no equivalent (the command gives the means)",
    "constant arrivals: the bench has none; the command gives gamma with burstiness 1000 (gaps within ~3% of "
    "even)",
    "multi-turn conversations: `vllm bench serve` has no such dataset (the command sends the turns as "
    "independent requests of the mean length)",
    "trace replay: vLLM's timed_trace (0.32) replays the timestamps as recorded; studyc rescales them to the "
    "rung's rate and draws each 512-token block's ids from its own seed",
)

"""The equivalent `vllm bench serve` command of a plan point."""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from compiler.bench_equivalent import REQUEST_BODY, bench_argv, bench_command


@dataclass(frozen=True)
class P:
    concurrency: int | None = 4
    rate_rps: float | None = None
    requests: int = 64
    warmup: int = 8
    input_len: int = 128
    output_len: int = 512
    prefix_len: int = 0
    prompt_seed: int = 7
    arrival: str = "poisson"
    burstiness: float = 1.0


def _opts(argv: list[str]) -> dict[str, str]:
    out = {}
    for i, a in enumerate(argv):
        if a.startswith("--"):
            nxt = argv[i + 1] if i + 1 < len(argv) else ""
            out[a] = "" if nxt.startswith("--") else nxt
    return out


def test_closed_loop_point() -> None:
    argv = bench_argv(P(), base_url="http://127.0.0.1:8000", model="models/qwen3-8b")
    assert argv[:3] == ["vllm", "bench", "serve"]
    o = _opts(argv)
    assert o["--random-input-len"] == "128" and o["--random-output-len"] == "512"
    assert o["--random-range-ratio"] == "0" and o["--num-prompts"] == "64"
    assert o["--temperature"] == "0" and "--ignore-eos" in o
    assert o["--max-concurrency"] == "4" and o["--request-rate"] == "inf"
    assert o["--tokenizer"] == "models/qwen3-8b" and o["--num-warmups"] == "8"
    assert "--burstiness" not in o


def test_open_loop_point_with_prefix_and_gamma() -> None:
    p = P(concurrency=None, rate_rps=2.5, input_len=1024, prefix_len=1000, arrival="gamma", burstiness=0.5,
          warmup=0)
    o = _opts(bench_argv(p, base_url="http://h:1", model="m", served_name="Qwen/Qwen3-8B",
                         vllm="python3 -m vllm.entrypoints.cli.main"))
    assert o["--request-rate"] == "2.5" and o["--burstiness"] == "0.5"
    assert o["--random-prefix-len"] == "1000" and o["--random-input-len"] == "24"
    assert "--max-concurrency" not in o and "--num-warmups" not in o
    assert o["--served-model-name"] == "Qwen/Qwen3-8B"


def test_poisson_is_burstiness_one_and_command_round_trips() -> None:
    p = P(concurrency=8, rate_rps=10.0, burstiness=3.0)
    line = bench_command(p, base_url="http://h:1", model="my model")
    o = _opts(shlex.split(line))
    assert o["--burstiness"] == "1" and o["--max-concurrency"] == "8" and o["--model"] == "my model"


def test_request_body_is_greedy_token_ids_with_usage() -> None:
    assert REQUEST_BODY["temperature"] == 0 and REQUEST_BODY["ignore_eos"] is True
    assert REQUEST_BODY["stream_options"] == {"include_usage": True}

"""Warm vs cold server starts, read from vLLM's own log lines (taken from H200 runs)."""

from pathlib import Path

from runner.execute.launch import compile_cache_state

COLD = (
    "(EngineCore pid=897) INFO 12-01 02:09:43 [backends.py:378] Cache the graph of compile range (1, 8192) for later use\n"
    "(EngineCore pid=897) INFO 12-01 02:09:50 [backends.py:393] Compiling a graph for compile range (1, 8192) takes 15.35 s\n"
)
WARM = (
    "(EngineCore pid=4274) INFO 11-29 23:46:58 [backends.py:292] Directly load the compiled graph(s) for compile "
    "range (1, 8192) from the cache, took 2.518 s\n"
)
EAGER = "(APIServer pid=1) WARNING 12-01 03:55:06 [vllm.py:1703] Enforce eager set, disabling torch.compile\n"


def test_cold_warm_and_eager_starts(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text(COLD)
    assert compile_cache_state(log) == "cold"
    start = log.stat().st_size  # the same log, a second start appended: only its own lines count
    log.write_text(COLD + WARM)
    assert compile_cache_state(log, start) == "warm"
    log.write_text(EAGER)
    assert compile_cache_state(log) is None
    assert compile_cache_state(tmp_path / "missing.log") is None

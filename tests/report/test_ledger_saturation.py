"""Which ledger points are near saturation (report.ledger.saturation): every slot busy, a preemption in the
window, or the KV demand near the server's capacity; read from a real DuckDB file of the committed results
with a preemption and a KV capacity written into it."""

from __future__ import annotations

from pathlib import Path

import pytest

from compiler.stepcost import EngineShape
from compiler.stepreplay import StepLoad
from report.ledger.ledger import read_points
from report.ledger.saturation import kv_demand_tokens, saturation
from runner.store.store import Store
from tests.conftest import committed_copy

CUDA_GRAPHS_H200 = "20261201T202615-d1cd5a"  # cuda-graphs: qwen3-8b graphs and eager, c1 and c64 decode


def test_the_rules() -> None:
    load = StepLoad(concurrency=64, requests=256, input_len=1000, output_len=24)
    assert kv_demand_tokens(load) == 64 * 1024
    assert saturation(load, EngineShape(max_num_seqs=256), None, None) == ""
    assert saturation(load, EngineShape(max_num_seqs=64), 0.0, 10**6) == "concurrency 64 >= max_num_seqs 64"
    assert saturation(load, EngineShape(max_num_seqs=256), 3.0, None) == "3 preemption(s) in the window"
    assert saturation(load, EngineShape(), None, 72_000) == "KV demand 65,536 tokens >= 90% of the server's 72,000"
    assert saturation(load, EngineShape(), None, 73_000) == ""  # 65,536 is under 90% of 73,000
    few = StepLoad(concurrency=64, requests=8, input_len=100, output_len=28, input_lens=(100,) * 7 + (400,), turns=2)
    assert kv_demand_tokens(few) == 8 * 2 * 428  # eight requests hold at most eight slots, each two turns long


@pytest.fixture(scope="module")
def marked(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = committed_copy("h200", tmp_path_factory.mktemp("sat") / "h200.duckdb")
    with Store(path) as store:
        store.con.execute("DELETE FROM runs WHERE run_id <> ?", [CUDA_GRAPHS_H200])
        store.con.execute("UPDATE points SET preemptions = 5 WHERE run_id = ? AND point_id = ?",
                          [CUDA_GRAPHS_H200, "cuda-graphs/graphs/L1/decode/c64/r1"])
        store.con.execute("UPDATE servers SET kv_capacity_tokens = 1000 WHERE run_id = ? AND server_id IN "
                          "(SELECT server_id FROM points WHERE run_id = ? AND point_id = ?)",
                          [CUDA_GRAPHS_H200, CUDA_GRAPHS_H200, "cuda-graphs/eager/L2/decode/c64/r1"])
    return path


def test_points_read_from_the_store_carry_why(marked: Path) -> None:
    points = {p.point_id: p for p in read_points(marked)}
    assert len(points) == 12 and points["cuda-graphs/graphs/L1/decode/c1/r1"].saturated == ""
    assert points["cuda-graphs/graphs/L1/decode/c64/r1"].saturated == "5 preemption(s) in the window"
    assert points["cuda-graphs/graphs/L2/decode/c64/r1"].saturated == ""  # the same load on another launch
    eager = points["cuda-graphs/eager/L2/decode/c64/r1"]
    assert eager.saturated == f"KV demand {kv_demand_tokens(eager.load):,} tokens >= 90% of the server's 1,000"
    one = points["cuda-graphs/eager/L2/decode/c1/r1"]  # the same server, one slot: under 900 tokens
    assert kv_demand_tokens(one.load) < 900 and one.saturated == ""
    assert sum(bool(p.saturated) for p in points.values()) == 2

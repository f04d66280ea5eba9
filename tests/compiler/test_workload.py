"""Workload shapes in the study file: each kind accepted, bad ones refused with file:line: key; the plan's
shape (None for a classic workload), its trace hash in the fingerprint, requests in whole conversations."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from compiler.load import load_study
from compiler.plan_compile import compile_study
from compiler.trace import TraceError, parse_histogram, parse_trace
from studyc.cli import main

REPO = Path(__file__).resolve().parents[2]
HEAD = f"""[study]
id = "w"
title = "t"
question = "q"
hardware = "cpu"

[model]
path = "{REPO}/models/tiny-qwen3"

[engine]
max_model_len = 512

[arms.a]

[load]
LOAD

[workloads.w]
"""


def write(tmp_path: Path, body: str, load: str = "concurrency = [2]\nrequests = 5") -> Path:
    path = tmp_path / "s.toml"
    path.write_text(HEAD.replace("LOAD", load) + body)
    return path


def validate(path: Path) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["validate", str(path)])
    assert "Traceback" not in result.output
    return result.exit_code, result.output


TRACE = [
    {"timestamp": 0, "input_length": 500, "output_length": 4, "hash_ids": [1]},
    {"timestamp": 30, "input_length": 100, "output_length": 8, "hash_ids": [1]},
]


def trace_file(tmp_path: Path, rows: list[dict] | None = None, name: str = "t.jsonl") -> str:
    (tmp_path / name).write_text("".join(json.dumps(r) + "\n" for r in rows or TRACE))
    return name


def test_a_ladder_counts_one_wave_in_conversations(tmp_path: Path) -> None:
    code, out = validate(write(tmp_path, "input_len = 64\noutput_len = 8\nturns = 3\n"))  # 5 requests: 2 conversations
    assert code == 0 and "load.requests: warning: 5 requests (2 conversations of 3 turns) at concurrency 2 is one " \
        "wave, not a steady state: give more conversations than the concurrency" in out
    code, out = validate(write(tmp_path, "input_len = 64\noutput_len = 8\nturns = 3\n",
                               load="concurrency = [2]\nrequests = 7"))  # 3 conversations
    assert code == 0 and "warning" not in out


@pytest.mark.parametrize("body", [
    'input_len = { dist = "uniform", min = 10, max = 100 }\noutput_len = 8\n',
    'input_len = { dist = "normal", mean = 100, sd = 20 }\noutput_len = { dist = "lognormal", mean = 20, sd = 5 }\n',
    'input_len = { dist = "histogram", values = [10, 20], weights = [1, 3] }\noutput_len = 4\n',
    'input_len = 64\noutput_len = 8\nprefix_len = 32\ntemplates = 4\n',
    'input_len = 64\noutput_len = 8\nturns = 3\nthink_s = 0.5\n',
    'input_len = 100\noutput_len = 100\nturns = 2\n',  # 2 x (100 + 100) = 400 fits 512
    'input_len = 100\noutput_len = 28\nturns = 4\n',  # 4 x 128 = 512: exactly fits
    'input_len = { dist = "uniform", min = 300, max = 400 }\noutput_len = { dist = "uniform", min = 212, max = 300 }\n',
])
def test_each_kind_validates(tmp_path: Path, body: str) -> None:
    # 24 requests: more than one wave of conversations at concurrency 2 for every turn count here (no warning)
    path = write(tmp_path, body, load="concurrency = [2]\nrequests = 24")
    assert validate(path) == (0, f"{tmp_path / 's.toml'}: ok (0 hypotheses)\n")


def test_trace_and_histogram_file_validate(tmp_path: Path) -> None:
    (tmp_path / "h.csv").write_text("length,weight\n10,1\n30,2\n")
    name = trace_file(tmp_path)
    path = write(tmp_path, f'trace = "{name}"\n\n[workloads.h]\ninput_len = {{ dist = "histogram", file = "h.csv" }}\n'
                           'output_len = 4\n', load="rate = [1.0]\n")
    assert validate(path)[0] == 0


@pytest.mark.parametrize(("body", "line", "expected"), [
    ('input_len = { dist = "zipf", min = 3 }\noutput_len = 8\n', 20,
     "workloads.w.input_len: unknown dist 'zipf'"),
    ('input_len = { dist = "uniform", min = 30, max = 10 }\noutput_len = 8\n', 20,
     "workloads.w.input_len: min (30) exceeds max (10)"),
    ('input_len = 64\noutput_len = 8\ntemplates = 4\n', 19,
     "workloads.w: `templates` needs a prefix_len"),
    ('input_len = 64\noutput_len = 8\nthink_s = 1.0\n', 19, "workloads.w: `think_s` is the pause between turns"),
    ('input_len = { dist = "uniform", min = 300, max = 400 }\noutput_len = { dist = "uniform", min = 213, max = 300 }\n',
     20, "workloads.w.input_len: the shortest request needs 513 tokens (input_len + output_len), more than "
         "max_model_len 512 of arm a"),
    ('input_len = 100\noutput_len = 29\nturns = 4\n', 20,
     "workloads.w.input_len: the shortest conversation over 4 turns needs 516 tokens"),
    ('input_len = { dist = "uniform", min = 30, max = 40 }\noutput_len = 8\nprefix_len = 30\n', 19,
     "workloads.w: prefix_len (30) must be below the shortest input_len (30)"),
    ('input_len = { dist = "histogram", file = "none.csv" }\noutput_len = 8\n', 20,
     "workloads.w.input_len.file: none.csv: no such file"),
    ('trace = "t.jsonl"\ninput_len = 5\n', 19, "workloads.w: a trace gives its own lengths and shared blocks: drop input_len"),
    ('output_len = 5\n', 19, "workloads.w: give `input_len` and `output_len`"),
])
def test_bad_workloads_name_file_line_and_key(tmp_path: Path, body: str, line: int, expected: str) -> None:
    path = write(tmp_path, body)
    code, out = validate(path)
    assert code == 2
    assert f"{path}:{line}: {expected}" in out, out


def test_bad_trace_names_its_own_line(tmp_path: Path) -> None:
    (tmp_path / "t.jsonl").write_text(json.dumps(TRACE[0]) + "\n\n{not json\n")
    code, out = validate(write(tmp_path, 'trace = "t.jsonl"\n'))
    assert code == 2 and f"{tmp_path / 's.toml'}:20: workloads.w.trace: t.jsonl:3: not a JSON object" in out, out
    code, out = validate(write(tmp_path, 'trace = "gone.jsonl"\n'))
    assert code == 2 and "workloads.w.trace: gone.jsonl: no such file" in out
    long = [{"timestamp": 40, "input_length": 509, "output_length": 4, "hash_ids": [1]}]
    trace_file(tmp_path, TRACE + long)
    code, out = validate(write(tmp_path, 'trace = "t.jsonl"\n'))
    assert code == 2 and "t.jsonl:3: input_length + output_length = 513 exceeds max_model_len 512" in out, out
    trace_file(tmp_path, [{**r, "input_length": 508} for r in long])
    assert validate(write(tmp_path, 'trace = "t.jsonl"\n'))[0] == 0  # 512 fits


def test_trace_arrivals_need_a_rate_and_a_trace_everywhere(tmp_path: Path) -> None:
    code, out = validate(write(tmp_path, "input_len = 8\noutput_len = 4\n", load='rate = [1.0]\narrival = "trace"'))
    assert code == 2 and ':17: load.arrival: arrival = "trace" needs a trace in every workload; workloads.w' in out
    code, out = validate(write(tmp_path, f'trace = "{trace_file(tmp_path)}"\n',
                               load='concurrency = [1]\narrival = "trace"'))
    assert code == 2 and 'arrival = "trace" replays a trace\'s timestamps at a `rate`' in out, out
    flat = [{**r, "timestamp": 7} for r in TRACE]
    code, out = validate(write(tmp_path, f'trace = "{trace_file(tmp_path, flat)}"\n', load='rate = [1.0]\narrival = "trace"'))
    assert code == 2 and "every timestamp is the same" in out


@pytest.mark.parametrize(("text", "line", "message"), [
    ('{"timestamp": 0, "input_length": 1, "output_length": 1}', 1, "missing key(s) hash_ids"),
    ('[1]', 1, "not a JSON object"),
    ('{"timestamp": -1, "input_length": 1, "output_length": 1, "hash_ids": [1]}', 1, "`timestamp` should be"),
    ('{"timestamp": 5, "input_length": 1, "output_length": 1, "hash_ids": [1]}\n'
     '{"timestamp": 4, "input_length": 1, "output_length": 1, "hash_ids": [1]}', 2, "before the previous row's"),
    ('{"timestamp": 0, "input_length": 0, "output_length": 1, "hash_ids": []}', 1, "`input_length` should be an integer >= 1"),
    ('{"timestamp": 0, "input_length": 513, "output_length": 1, "hash_ids": [1]}', 1, "need 2"),
    ('{"timestamp": 0, "input_length": 512, "output_length": 1, "hash_ids": [1, 2]}', 1, "need 1"),
    ('{"timestamp": 0, "input_length": 5, "output_length": true, "hash_ids": [1]}', 1, "`output_length` should be"),
    ('', 1, "no rows"),
])
def test_trace_parse_errors(text: str, line: int, message: str) -> None:
    with pytest.raises(TraceError) as info:
        parse_trace(text)
    assert info.value.line == line and message in info.value.message


def test_histogram_csv() -> None:
    assert parse_histogram("length,weight\n5,1\n9,0.5\n") == ((5, 9), (1.0, 0.5))
    for bad, line in (("5,1,2\n", 1), ("5,1\n0,1\n", 2), ("5,0\n", 1), ("a,1\n", 1)):
        with pytest.raises(TraceError) as info:
            parse_histogram(bad)
        assert info.value.line == line


def test_plan_shape_none_for_classic_and_trace_hash_in_fingerprint(tmp_path: Path) -> None:
    classic = compile_study(load_study(write(tmp_path, "input_len = 8\noutput_len = 4\n")))
    point = classic.points[0]
    assert point.shape is None and "shape" not in json.loads(point.model_dump_json())
    name = trace_file(tmp_path)
    first = compile_study(load_study(write(tmp_path, f'trace = "{name}"\n'))).points[0]
    assert first.shape is not None and first.shape.trace is not None and first.shape.trace.rows == 2
    assert (first.input_len, first.output_len) == (300, 6)  # the trace's means
    trace_file(tmp_path, [TRACE[0], {**TRACE[1], "output_length": 9}])
    second = compile_study(load_study(write(tmp_path, f'trace = "{name}"\n'))).points[0]
    assert second.fingerprint != first.fingerprint and second.shape.trace.sha256 != first.shape.trace.sha256
    (tmp_path / "moved").mkdir()
    trace_file(tmp_path / "moved", [TRACE[0], {**TRACE[1], "output_length": 9}], name)
    moved = compile_study(load_study(write(tmp_path, f'trace = "moved/{name}"\n'))).points[0]
    assert moved.fingerprint == second.fingerprint  # the trace by content, not by where it lies


def test_multi_turn_requests_round_up_to_whole_conversations(tmp_path: Path) -> None:
    plan = compile_study(load_study(write(tmp_path, "input_len = 10\noutput_len = 4\nturns = 3\n")))
    point = plan.points[0]
    assert point.requests == 6  # 5 requests -> 2 conversations of 3 turns
    assert point.input_len == round(10 * 2 + 4 * 1)  # the mean prompt over the turns: 10, 24, 38
    exact = compile_study(load_study(write(tmp_path, "input_len = 10\noutput_len = 4\nturns = 5\n")))
    assert exact.points[0].requests == 5


def test_bench_equivalent_of_shapes(tmp_path: Path) -> None:
    from compiler.bench_equivalent import bench_argv

    def argv(body: str) -> str:
        point = compile_study(load_study(write(tmp_path, body))).points[0]
        return " ".join(bench_argv(point, base_url="http://h:1", model="m"))

    both = argv('input_len = { dist = "uniform", min = 50, max = 150 }\noutput_len = { dist = "uniform", min = 5, max = 15 }\n')
    assert "--random-input-len 100 --random-prefix-len 0 --random-output-len 10 --random-range-ratio 0.5" in both
    one = argv('input_len = { dist = "uniform", min = 50, max = 150 }\noutput_len = 10\n')
    assert "--random-range-ratio 0 " in one  # one ratio cannot draw one length and fix the other
    assert "--dataset-name prefix_repetition --prefix-repetition-prefix-len 32 --prefix-repetition-suffix-len 32 " \
        "--prefix-repetition-num-prefixes 4 --prefix-repetition-output-len 8" in argv(
            "input_len = 64\noutput_len = 8\nprefix_len = 32\ntemplates = 4\n")
    replay = argv(f'trace = "{trace_file(tmp_path)}"\n')
    assert "--dataset-name timed_trace" in replay and "--timed-trace-chunk-hash-size 512" in replay
    assert "--no-self-timed" in replay


def test_constant_arrivals_plan_and_run_evenly(tmp_path: Path) -> None:
    from compiler.bench_equivalent import bench_argv
    from runner.load.workload import arrival_times

    point = compile_study(load_study(write(tmp_path, "input_len = 8\noutput_len = 4\n",
                                           load='rate = [4.0]\narrival = "constant"'))).points[0]
    assert point.arrival == "constant"
    assert arrival_times(3, point.rate_rps or 0.0, arrival=point.arrival) == [0.0, 0.25, 0.5]
    assert "--burstiness 1000" in " ".join(bench_argv(point, base_url="http://h:1", model="m"))

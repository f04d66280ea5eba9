"""The loopback instrument: vLLM 0.32's exact stream format, pacing, send logs, faults, CLI."""

from __future__ import annotations

import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from runner.load.instrument import Instrument
from runner.load.stream_server import prompt_key, read_send_log

REPO = Path(__file__).resolve().parents[2]
CONTENT_KEYS = ["id", "object", "created", "model", "choices"]
CHOICE_KEYS = ["index", "text", "logprobs", "finish_reason", "stop_reason", "prompt_token_ids", "token_ids"]


def raw_post(port: int, body: dict, *, headers: str = "", timeout_s: float = 10) -> bytes:
    """POST over a plain socket; return the raw response bytes (the server closes nothing: read to 0-chunk)."""
    data = json.dumps(body).encode()
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as s:
        s.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + headers.encode() + b"Content-Length: %d\r\n\r\n" % len(data) + data
        )
        out = b""
        while True:
            head_end = out.find(b"\r\n\r\n")
            if head_end >= 0:
                head = out[:head_end].lower()
                if b"chunked" in head and out.endswith(b"0\r\n\r\n"):
                    return out
                if b"content-length:" in head:
                    n = int(head.split(b"content-length:")[1].split(b"\r\n")[0])
                    if len(out) >= head_end + 4 + n:
                        return out
            got = s.recv(65536)
            if not got:
                return out
            out += got


def dechunk(raw: bytes) -> tuple[bytes, bytes]:
    head, _, rest = raw.partition(b"\r\n\r\n")
    body = b""
    while True:
        line, _, rest = rest.partition(b"\r\n")
        size = int(line, 16)
        if size == 0:
            return head, body
        body += rest[:size]
        assert rest[size:size + 2] == b"\r\n"
        rest = rest[size + 2:]


def events(body: bytes) -> list[bytes]:
    assert body.endswith(b"\n\n")
    return [e for e in body.split(b"\n\n") if e]


def completion(prompt: list[int] | str, max_tokens: int, **kw: object) -> dict:
    return {"model": "m", "prompt": prompt, "max_tokens": max_tokens, "stream": True,
            "stream_options": {"include_usage": True}, **kw}


def test_stream_matches_vllm_format() -> None:
    with Instrument() as inst:
        raw = raw_post(inst.port, completion(list(range(10, 74)), 7))
    head, body = dechunk(raw)
    assert head.startswith(b"HTTP/1.1 200 OK\r\n")
    assert b"content-type: text/event-stream; charset=utf-8" in head
    assert b"transfer-encoding: chunked" in head
    evs = events(body)
    assert len(evs) == 7 + 2  # one chunk per token, the usage chunk, [DONE]
    assert all(e.startswith(b"data: ") for e in evs)
    assert evs[-1] == b"data: [DONE]"
    chunks = [json.loads(e[6:]) for e in evs[:-1]]
    for c in chunks[:-1]:
        assert list(c) == CONTENT_KEYS  # no "usage" key on content chunks, like vLLM 0.32
        assert c["object"] == "text_completion" and c["model"] == "m"
        assert list(c["choices"][0]) == CHOICE_KEYS
        assert c["choices"][0]["text"].startswith(" w")
    assert [c["choices"][0]["finish_reason"] for c in chunks[:-1]] == [None] * 6 + ["length"]
    usage = chunks[-1]
    assert usage["choices"] == []
    assert usage["usage"]["prompt_tokens"] == 64 and usage["usage"]["completion_tokens"] == 7
    assert usage["usage"]["total_tokens"] == 71
    assert len({c["id"] for c in chunks}) == 1 and chunks[0]["id"].startswith("cmpl-")
    # compact JSON exactly as pydantic writes it
    assert evs[0].startswith(b'data: {"id":"cmpl-') and b'"choices":[{"index":0,"text":" w' in evs[0]


def test_each_stream_has_its_own_id_and_names_its_serial() -> None:
    with Instrument() as inst:
        a = events(dechunk(raw_post(inst.port, completion([5, 6], 2)))[1])
        b = events(dechunk(raw_post(inst.port, completion([7, 8], 2)))[1])
    ida, idb = json.loads(a[0][6:])["id"], json.loads(b[0][6:])["id"]
    assert ida != idb and len(ida) == len(idb)
    assert json.loads(a[0][6:])["choices"][0]["text"] == " w1"
    assert json.loads(b[0][6:])["choices"][0]["text"] == " w2"


def test_tokens_per_chunk_coalesces_but_usage_counts_tokens() -> None:
    with Instrument(tokens_per_chunk=3) as inst:
        evs = events(dechunk(raw_post(inst.port, completion([1, 2, 3], 10)))[1])
    content = [e for e in evs if b'"choices":[{' in e]
    assert len(content) == 4  # ceil(10 / 3)
    assert sum(len(json.loads(e[6:])["choices"][0]["text"].split()) for e in content) == 10
    assert json.loads(evs[-2][6:])["usage"]["completion_tokens"] == 10


def test_paced_stream_logs_send_times_at_the_interval() -> None:
    itl = 0.004
    with Instrument(itl_s=itl) as inst:
        t0 = time.monotonic()
        raw_post(inst.port, completion([9, 9, 9], 20))
        elapsed = time.monotonic() - t0
        (log,) = inst.send_log()
    assert log.chunks == 20 and len(log.times) == 20 and log.key == prompt_key([9, 9, 9])
    gaps = sorted(b - a for a, b in itertools.pairwise(log.times))
    # Sends follow a schedule of due times: never early; late ones (a stolen slice) catch up.
    assert log.times[-1] - log.t_request >= 19 * itl
    assert gaps[len(gaps) // 2] == pytest.approx(itl, rel=0.25)
    assert elapsed >= 19 * itl
    assert log.t_request <= log.times[0] <= log.t_end  # type: ignore[operator]


def test_burst_writes_whole_response_and_logs_one_time() -> None:
    with Instrument() as inst:
        raw_post(inst.port, completion([1], 50))
        (log,) = inst.send_log()
        assert inst.stats()["max_in_flight"] == 1
    assert log.chunks == 50 and len(set(log.times)) == 1


def test_fail_every_answers_http_error_in_vllm_shape() -> None:
    with Instrument(fail_every=2, fail_status=503) as inst:
        ok = raw_post(inst.port, completion([1], 3))
        bad = raw_post(inst.port, completion([1], 3))
    assert ok.startswith(b"HTTP/1.1 200")
    assert bad.startswith(b"HTTP/1.1 503")
    assert json.loads(bad.split(b"\r\n\r\n", 1)[1])["error"]["code"] == 503


def test_hang_sends_some_chunks_then_nothing() -> None:
    with Instrument(hang_every=1, hang_after=2) as inst:
        with pytest.raises(socket.timeout):
            raw_post(inst.port, completion([1], 10), timeout_s=0.5)
        (log,) = inst.send_log()
    assert log.chunks == 2 and log.fault == "hang"


def test_disconnect_and_error_event_faults() -> None:
    with Instrument(disconnect_every=2, disconnect_after=3, error_every=3, error_after=1) as inst:
        raw_post(inst.port, completion([1], 5))  # serial 1: normal
        cut = raw_post(inst.port, completion([1], 5))  # serial 2: reset after 3 chunks
        err = raw_post(inst.port, completion([1], 5))  # serial 3: error event
    assert not cut.endswith(b"0\r\n\r\n") and cut.count(b'"choices":[{') == 3
    evs = events(dechunk(err)[1])
    assert json.loads(evs[1][6:])["error"]["message"] == "Internal server error"
    assert evs[-1] == b"data: [DONE]"


def test_request_can_ask_for_a_fault_in_its_body() -> None:
    with Instrument() as inst:
        bad = raw_post(inst.port, completion([1], 3, instrument={"fail_status": 429}))
    assert bad.startswith(b"HTTP/1.1 429")


def test_api_key_is_required_when_set() -> None:
    with Instrument(api_key="sekrit") as inst:
        denied = raw_post(inst.port, completion([1], 2))
        allowed = raw_post(inst.port, completion([1], 2), headers="Authorization: Bearer sekrit\r\n")
    assert denied.startswith(b"HTTP/1.1 401") and allowed.startswith(b"HTTP/1.1 200")


def listening_addresses(port: int) -> list[str]:
    """Local addresses (hex, as /proc/net/tcp{,6} write them) of sockets listening on `port`."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if os.path.exists(table):
            for line in Path(table).read_text().splitlines()[1:]:
                local, state = line.split()[1], line.split()[3]
                addr, _, hex_port = local.partition(":")
                if state == "0A" and int(hex_port, 16) == port:
                    found.append(addr)
    return found


def test_binds_loopback_only() -> None:
    with Instrument() as inst:
        assert inst.base_url == f"http://127.0.0.1:{inst.port}"
        assert listening_addresses(inst.port) == ["0100007F"]  # 127.0.0.1, nothing else


def test_pins_its_thread_to_a_core() -> None:
    cpu = min(os.sched_getaffinity(0))
    with Instrument(cpu=cpu) as inst:
        tid = inst._thread.native_id  # type: ignore[union-attr]
        assert os.sched_getaffinity(tid) == {cpu}
    assert len(os.sched_getaffinity(0)) >= 1  # the calling thread is left alone


def test_cli_subprocess_ready_dump_and_sigterm(tmp_path: Path) -> None:
    log = tmp_path / "sends.jsonl"
    cpu = max(os.sched_getaffinity(0))
    proc = subprocess.Popen(
        [sys.executable, "-m", "runner.load.instrument", "--port", "0", "--itl-ms", "1", "--send-log", str(log),
         "--cpu", str(cpu)],
        cwd=REPO, stdout=subprocess.PIPE, text=True,
    )
    try:
        line = proc.stdout.readline()  # type: ignore[union-attr]
        assert line.startswith("READY ")
        port = int(line.split()[1])
        assert os.sched_getaffinity(proc.pid) == {cpu}
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
            assert r.status == 200
        raw_post(port, completion([3, 1, 4], 5))
        req = urllib.request.Request(f"http://127.0.0.1:{port}/_instrument/dump", data=b"", method="POST")
        with urllib.request.urlopen(req, timeout=5) as r:
            assert json.loads(r.read())["streams"] == 1
        (entry,) = read_send_log(str(log))
        assert entry.chunks == 5 and len(entry.times) == 5 and entry.key == prompt_key([3, 1, 4])
        raw_post(port, completion([2, 7], 3))
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    (last,) = read_send_log(str(log))  # the rest is written at exit
    assert last.key == prompt_key([2, 7])


def test_prompt_key_is_stable_and_distinguishes_prompts() -> None:
    assert prompt_key([1, 2, 3]) == prompt_key((1, 2, 3))
    assert prompt_key([1, 2, 3]) != prompt_key([1, 2, 4])
    assert prompt_key("w1 w2") != prompt_key("w1 w3")
    assert len(prompt_key([1])) == 16

#!/usr/bin/env python3
"""Load generator ceiling: studyc's client against `vllm bench serve`'s, on this host.

Both clients stream from the loopback instrument (runner/load/instrument.py), which writes vLLM 0.32's
exact SSE bytes. The instrument and this driver run on core 0, each client on core 1 (`taskset`),
so client and server never share a core; core 0 is also where a CPU vLLM pins its model thread.

Burst: the instrument writes each response whole, so the client's reading is the only limit.
At rising concurrency, alternating the two clients, it reports sustained SSE chunks/s and
requests/s over each client's own measured window, and the client's CPU per 1,000 chunks (every
thread of the client's process tree, from /proc schedstat, over that window).

Paced: the instrument sends each stream's chunks 1 ms apart (15 streams = 15,000 chunks/s) and
logs its send times. Timestamp distortion = |client-measured gap between consecutive chunks -
the instrument's true send gap|, p50/p99 over all chunk pairs (for vllm bench, from its saved
detailed ITLs). The instrument's own deviation from 1 ms is printed beside it as the noise floor.

    .venv/bin/python benchmarks/loadgen_ceiling.py --quick     # < 3 minutes
    .venv/bin/python benchmarks/loadgen_ceiling.py --repeats 3 --json out.json

The last line is `best ratio studyc/vllm-bench: X.XX` (best chunks/s of each, any concurrency).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

STUDYC_PY = REPO / ".venv" / "bin" / "python"
VLLM = REPO / ".venv-vllm" / "bin" / "vllm"
VLLM_PY = REPO / ".venv-vllm" / "bin" / "python"
TINY = REPO / "models" / "tiny-qwen3"
SERVER_CPU, CLIENT_CPU = 0, 1
INPUT_LEN = 32
VOCAB_LO, VOCAB_HI = 4, 4096


# ------------------------------------------------------------------------------ CPU accounting
def _task_ns(pid: int) -> tuple[int, list[int]]:
    """CPU ns of every thread of pid, and its child pids."""
    total = 0
    kids: list[int] = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                    total += int(f.read().split()[0])
                with open(f"/proc/{pid}/task/{tid}/children") as f:
                    kids.extend(int(x) for x in f.read().split())
            except OSError:
                pass
    except OSError:
        pass
    return total, kids


class CpuSampler:
    """Samples the CPU seconds of process trees every few ms (monotonic-stamped) on a thread."""

    def __init__(self, roots: dict[str, int], interval_s: float = 0.01) -> None:
        self.roots = roots
        self.interval_s = interval_s
        self.samples: dict[str, list[tuple[float, float]]] = {k: [] for k in roots}
        self._dead: dict[str, dict[int, int]] = {k: {} for k in roots}  # last seen ns of exited pids
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _tree_ns(self, name: str, root: int) -> int:
        seen: dict[int, int] = {}
        todo = [root]
        while todo:
            pid = todo.pop()
            ns, kids = _task_ns(pid)
            seen[pid] = ns
            todo.extend(kids)
        gone = self._dead[name]
        total = sum(seen.values())
        for pid, ns in list(gone.items()):
            if pid not in seen:
                total += ns  # keep the CPU of a worker that has exited
        gone.update(seen)
        return total

    def _run(self) -> None:
        while not self._stop.is_set():
            for name, pid in self.roots.items():
                t = time.monotonic()
                self.samples[name].append((t, self._tree_ns(name, pid) / 1e9))
            self._stop.wait(self.interval_s)

    def __enter__(self) -> CpuSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def between(self, name: str, t0: float, t1: float) -> float | None:
        s = self.samples[name]
        if len(s) < 2 or t1 <= t0:
            return None
        return _interp(s, t1) - _interp(s, t0)


def _interp(s: list[tuple[float, float]], t: float) -> float:
    if t <= s[0][0]:
        return s[0][1]
    for (ta, va), (tb, vb) in itertools.pairwise(s):
        if ta <= t <= tb:
            return va + (vb - va) * (t - ta) / (tb - ta) if tb > ta else vb
    return s[-1][1]


# -------------------------------------------------------------------------------- the instrument
class InstrumentProc:
    def __init__(self, *args: str, send_log: Path | None = None) -> None:
        cmd = [str(STUDYC_PY), "-m", "runner.load.instrument", "--port", "0", "--cpu", str(SERVER_CPU), *args]
        if send_log is not None:
            cmd += ["--send-log", str(send_log)]
        self.send_log = send_log
        self.proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()  # type: ignore[union-attr]
        if not line.startswith("READY "):
            raise SystemExit(f"instrument did not start: {line!r}")
        self.port = int(line.split()[1])
        self.url = f"http://127.0.0.1:{self.port}"

    def post(self, path: str) -> dict:
        req = urllib.request.Request(self.url + path, data=b"", method="POST")
        with urllib.request.urlopen(req, timeout=30) as r:
            return json.loads(r.read())

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


# ------------------------------------------------------------------------------------- trials
@dataclass
class Trial:
    client: str  # "studyc", "studyc+busy_poll" or "vllm-bench"
    mode: str  # "burst" or "paced"
    concurrency: int
    requests: int
    ok: int
    chunks: int
    window_s: float
    cpu_s: float | None
    instrument_cpu_s: float | None
    chunks_per_s: float = 0.0
    requests_per_s: float = 0.0
    cpu_ms_per_1k: float | None = None
    distortion_ms: dict[str, float] = field(default_factory=dict)
    noise_floor_ms: dict[str, float] = field(default_factory=dict)
    error: str | None = None

    def finish(self) -> Trial:
        if self.window_s > 0:
            self.chunks_per_s = self.chunks / self.window_s
            self.requests_per_s = self.ok / self.window_s
        if self.cpu_s is not None and self.chunks:
            self.cpu_ms_per_1k = self.cpu_s / self.chunks * 1e3 * 1e3
        return self


def studyc_client_main(cfg: dict[str, Any]) -> None:
    """Runs in the client subprocess (pinned to the client core by taskset)."""
    from runner.load.loadgen import RequestSpec, make_prompts, run_load
    from runner.load.stream_server import prompt_key

    prompts = make_prompts(cfg["n"], INPUT_LEN, vocab_lo=VOCAB_LO, vocab_hi=VOCAB_HI, seed=cfg["seed"])
    specs = [RequestSpec(p, cfg["out_len"]) for p in prompts]
    res = run_load(cfg["url"], "instrument", specs, concurrency=cfg["concurrency"],
                   busy_poll=cfg.get("busy_poll", False))
    m = res.measured
    out: dict[str, Any] = {
        "window_start": res.window_start_s, "window_end": res.window_end_s, "workers": res.workers,
        "ok": sum(r.ok for r in m), "chunks": sum(r.chunks for r in m),
        "errors": sorted({r.error for r in m if r.error})[:3],
    }
    if cfg.get("times"):
        out["times"] = {prompt_key(p): list(r.token_times_s) for p, r in zip(prompts, m, strict=True)}
    Path(cfg["out"]).write_text(json.dumps(out))


def run_studyc(url: str, mode: str, c: int, n: int, out_len: int, seed: int, tmp: Path,
               instrument_pid: int, busy_poll: bool = False) -> tuple[Trial, dict]:
    out = tmp / f"studyc-{mode}-{c}-{seed}.json"
    cfg = {"url": url, "concurrency": c, "n": n, "out_len": out_len, "seed": seed, "out": str(out),
           "times": mode == "paced", "busy_poll": busy_poll}
    cmd = ["taskset", "-c", str(CLIENT_CPU), str(STUDYC_PY), __file__, "--client-trial", json.dumps(cfg)]
    proc = subprocess.Popen(cmd, cwd=REPO)
    with CpuSampler({"client": proc.pid, "instrument": instrument_pid}) as cpu:
        rc = proc.wait()
    name = "studyc+busy_poll" if busy_poll else "studyc"
    if rc != 0 or not out.exists():
        return Trial(name, mode, c, n, 0, 0, 0.0, None, None, error=f"exit {rc}"), {}
    d = json.loads(out.read_text())
    t0, t1 = d["window_start"], d["window_end"]
    trial = Trial(name, mode, c, n, d["ok"], d["chunks"], t1 - t0, cpu.between("client", t0, t1),
                  cpu.between("instrument", t0, t1), error="; ".join(d["errors"]) or None).finish()
    return trial, d.get("times", {})


def run_vllm(url: str, mode: str, c: int, n: int, out_len: int, seed: int, tmp: Path, model: Path,
             instrument_pid: int) -> tuple[Trial, dict]:
    name = f"vllm-{mode}-{c}-{seed}.json"
    cmd = [
        "taskset", "-c", str(CLIENT_CPU), str(VLLM), "bench", "serve", "--backend", "vllm",
        "--base-url", url, "--model", str(model), "--tokenizer", str(model),
        "--dataset-name", "random", "--random-input-len", str(INPUT_LEN), "--random-output-len", str(out_len),
        "--num-prompts", str(n), "--max-concurrency", str(c), "--ignore-eos", "--temperature", "0",
        "--seed", str(seed), "--disable-tqdm",
        "--save-result", "--save-detailed", "--result-dir", str(tmp), "--result-filename", name,
    ]
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", VLLM_NO_USAGE_STATS="1")
    log = tmp / (name + ".log")
    with open(log, "w") as lf:
        proc = subprocess.Popen(cmd, cwd=tmp, stdout=lf, stderr=subprocess.STDOUT, env=env)
        with CpuSampler({"client": proc.pid, "instrument": instrument_pid}) as cpu:
            rc = proc.wait()
    path = tmp / name
    if rc != 0 or not path.exists():
        tail = log.read_text()[-400:].strip().replace("\n", " | ")
        return Trial("vllm-bench", mode, c, n, 0, 0, 0.0, None, None, error=f"exit {rc}: {tail}"), {}
    d = json.loads(path.read_text())
    starts, ttfts, itls, lats = d["start_times"], d["ttfts"], d["itls"], d["latencies"]
    errors = d.get("errors") or [""] * len(starts)
    ok_idx = [i for i in range(len(starts)) if not errors[i] and ttfts[i]]
    chunks = sum(len(itls[i]) + 1 for i in ok_idx)
    t0 = min(starts[i] for i in ok_idx)
    t1 = max(starts[i] + lats[i] for i in ok_idx)
    times: dict[str, list[float]] = {}
    if mode == "paced":  # absolute chunk times, keyed by the stream serial the instrument wrote first
        for i in ok_idx:
            t = starts[i] + ttfts[i]
            ts = [t]
            for g in itls[i]:
                t += g
                ts.append(t)
            serial = d["generated_texts"][i].split()[0]
            times[serial] = ts
    trial = Trial("vllm-bench", mode, c, n, len(ok_idx), chunks, t1 - t0, cpu.between("client", t0, t1),
                  cpu.between("instrument", t0, t1),
                  error=(next((e for e in errors if e), None) or None)).finish()
    return trial, times


def _q(xs: list[float], p: float) -> float:
    return xs[min(len(xs) - 1, int(p * len(xs)))] if xs else math.nan


def distortion(times: dict[str, list[float]], logs: list[Any], by: str) -> tuple[dict, dict]:
    """p50/p99 |client gap - true send gap| (ms), and the instrument's own |gap - 1 ms|."""
    index = {(log.key if by == "key" else f"w{log.serial}"): log for log in logs}
    diffs: list[float] = []
    floor: list[float] = []
    unmatched = 0
    for k, ct in times.items():
        log = index.get(k)
        if log is None or len(log.times) != len(ct):
            unmatched += 1
            continue
        st = log.times
        for i in range(1, len(ct)):
            true_gap = st[i] - st[i - 1]
            diffs.append(abs((ct[i] - ct[i - 1]) - true_gap))
            floor.append(abs(true_gap - 0.001))
    diffs.sort()
    floor.sort()
    d = {"p50": _q(diffs, 0.5) * 1e3, "p99": _q(diffs, 0.99) * 1e3, "pairs": len(diffs), "unmatched": unmatched}
    f = {"p50": _q(floor, 0.5) * 1e3, "p99": _q(floor, 0.99) * 1e3}
    return d, f


# ------------------------------------------------------------------------------------- driver
def tiny_model(tmp: Path) -> Path:
    """The repo's tiny model folder, its tokenizer built locally if missing (`tmp` is unused)."""
    from runner.server.tokenizer import ensure_tokenizer

    ensure_tokenizer(TINY)
    return TINY


def med_range(xs: list[float]) -> str:
    return f"{statistics.median(xs):.4f}" + (f" ({min(xs):.4f}-{max(xs):.4f})" if len(xs) > 1 else "")


def fmt_k(x: float) -> str:
    return f"{x / 1e3:,.1f} k"


def summarize(trials: list[Trial]) -> tuple[float, float, float | None]:
    v = [t.chunks_per_s for t in trials if not t.error]
    cpu = [t.cpu_ms_per_1k for t in trials if t.cpu_ms_per_1k is not None and not t.error]
    return (statistics.median(v) if v else 0.0, min(v, default=0.0),
            statistics.median(cpu) if cpu else None)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="one repeat, fewer requests: under 3 minutes")
    ap.add_argument("--levels", default=None, help="concurrency levels, comma-separated")
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--output-len", type=int, default=256, help="tokens per request in burst mode")
    ap.add_argument("--per-chunk-writes", action="store_true",
                    help="burst with one instrument write per chunk (as a server streams; the instrument "
                         "then caps near 350 k chunks/s) instead of one write per response")
    ap.add_argument("--json", default=None, help="write every trial here")
    ap.add_argument("--only", choices=["burst", "paced"], default=None, help="run one part only")
    ap.add_argument("--client-trial", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.client_trial:
        studyc_client_main(json.loads(a.client_trial))
        return 0
    if len(os.sched_getaffinity(0)) < 2 and not {SERVER_CPU, CLIENT_CPU} <= os.sched_getaffinity(0):
        raise SystemExit("needs cores 0 and 1")
    for tool in (STUDYC_PY, VLLM):
        if not tool.exists():
            raise SystemExit(f"missing {tool}")
    if not shutil.which("taskset"):
        raise SystemExit("missing taskset")
    os.sched_setaffinity(0, {SERVER_CPU})  # this driver and its sampler stay off the client's core
    levels = [int(x) for x in a.levels.split(",")] if a.levels else (
        [1, 8, 64, 256, 1024] if a.quick else [1, 4, 16, 64, 256, 1024])
    if a.only == "paced":
        levels = []
    repeats = a.repeats or (1 if a.quick else 3)
    base_n = 1500 if a.quick else 2500
    paced_streams, paced_len = 15, 400
    paced_n = 45 if a.quick else 150
    # vllm bench costs ~10 s of start-up per run; studyc's paced runs cost ~2 s: repeat those more.
    paced_repeats = max(repeats, 3)
    vllm_paced_repeats = 1 if a.quick else repeats

    t_start = time.monotonic()
    all_trials: list[Trial] = []
    with tempfile.TemporaryDirectory(prefix="studyc-ceiling-") as td:
        tmp = Path(td)
        model = tiny_model(tmp)
        burst = InstrumentProc("--no-log", *(["--per-chunk-writes"] if a.per_chunk_writes else []))
        paced = InstrumentProc("--itl-ms", "1", send_log=tmp / "sends.jsonl")
        try:
            print(f"# instrument + driver on core {SERVER_CPU}, clients on core {CLIENT_CPU}; "
                  f"prompts {INPUT_LEN} tokens; vllm bench --disable-tqdm; model {model}", flush=True)
            how = "one write per chunk" if a.per_chunk_writes else "whole responses"
            print(f"## burst: {how} of {a.output_len} tokens, {repeats} repeat(s), alternating clients",
                  flush=True)
            for c in levels:
                n = max(2 * c, base_n)
                for r in range(repeats):
                    order = ["studyc", "vllm"] if (r + levels.index(c)) % 2 == 0 else ["vllm", "studyc"]
                    for who in order:
                        seed = 1000 * c + r
                        if who == "studyc":
                            t, _ = run_studyc(burst.url, "burst", c, n, a.output_len, seed, tmp, burst.proc.pid)
                        else:
                            t, _ = run_vllm(burst.url, "burst", c, n, a.output_len, seed, tmp, model,
                                            burst.proc.pid)
                        all_trials.append(t)
                        inst = (f"{t.instrument_cpu_s / t.window_s:.0%}"
                                if t.instrument_cpu_s is not None and t.window_s else "-")
                        cpu = f"{t.cpu_ms_per_1k:.2f}" if t.cpu_ms_per_1k is not None else "-"
                        print(f"   c={c:<5} {t.client:<11} {fmt_k(t.chunks_per_s):>10} chunks/s "
                              f"{t.requests_per_s:8,.0f} req/s  cpu {cpu} ms/1k chunks  "
                              f"instrument busy {inst}  window {t.window_s:.2f}s"
                              + (f"  ERROR {t.error}" if t.error else ""), flush=True)

            print(f"## paced: {paced_streams} streams x {paced_len} chunks 1 ms apart "
                  f"(~{paced_streams * 1000:,} chunks/s), {paced_repeats} repeat(s) "
                  f"({vllm_paced_repeats} of vllm bench)", flush=True)
            from runner.load.stream_server import read_send_log

            for r in range(paced_repeats if a.only != "burst" else 0):
                for who in (["studyc", "vllm", "studyc+busy_poll"] if r % 2 == 0
                            else ["studyc+busy_poll", "vllm", "studyc"]):
                    if who == "vllm" and r >= vllm_paced_repeats:
                        continue
                    paced.post("/_instrument/reset")
                    seed = 7_000_000 + r
                    if who == "vllm":
                        t, times = run_vllm(paced.url, "paced", paced_streams, paced_n, paced_len, seed, tmp,
                                            model, paced.proc.pid)
                        by = "serial"
                    else:
                        t, times = run_studyc(paced.url, "paced", paced_streams, paced_n, paced_len, seed, tmp,
                                              paced.proc.pid, busy_poll=who.endswith("busy_poll"))
                        by = "key"
                    paced.post("/_instrument/dump")
                    logs = read_send_log(str(paced.send_log))
                    t.distortion_ms, t.noise_floor_ms = distortion(times, logs, by)
                    all_trials.append(t)
                    dd, nf = t.distortion_ms, t.noise_floor_ms
                    print(f"   {t.client:<17} {t.chunks_per_s:8,.0f} chunks/s  distortion p50 "
                          f"{dd.get('p50', math.nan):.4f} p99 {dd.get('p99', math.nan):.4f} ms "
                          f"({dd.get('pairs', 0):,} gaps)  instrument |gap-1ms| p50 {nf.get('p50', math.nan):.4f} "
                          f"p99 {nf.get('p99', math.nan):.4f} ms" + (f"  ERROR {t.error}" if t.error else ""),
                          flush=True)
        finally:
            burst.close()
            paced.close()

    # ----------------------------------------------------------------------------- the table
    print()
    print("| concurrency | studyc chunks/s median (min) | req/s | CPU ms/1k chunks | "
          "vllm bench chunks/s median (min) | req/s | CPU ms/1k chunks | ratio |")
    print("|---|---|---|---|---|---|---|---|")
    best: dict[str, tuple[float, int]] = {"studyc": (0.0, 0), "vllm-bench": (0.0, 0)}
    for c in levels:
        row = {}
        for who in ("studyc", "vllm-bench"):
            ts = [t for t in all_trials if t.mode == "burst" and t.client == who and t.concurrency == c]
            med, lo, cpu = summarize(ts)
            rps = statistics.median([t.requests_per_s for t in ts if not t.error] or [0.0])
            row[who] = (med, lo, cpu, rps)
            if med > best[who][0]:
                best[who] = (med, c)
        s, v = row["studyc"], row["vllm-bench"]
        ratio = s[0] / v[0] if v[0] else math.nan

        def cell(x: tuple) -> str:
            cpu = f"{x[2]:.2f}" if x[2] is not None else "-"
            return f"{fmt_k(x[0])} ({fmt_k(x[1])}) | {x[3]:,.0f} | {cpu}"

        print(f"| {c} | {cell(s)} | {cell(v)} | {ratio:.2f} |")
    print()
    print("| paced client | chunks/s | distortion p50 (ms) | distortion p99 (ms) | instrument noise p50 / p99 (ms) |")
    print("|---|---|---|---|---|")
    for who in ("studyc", "studyc+busy_poll", "vllm-bench"):
        ts = [t for t in all_trials if t.mode == "paced" and t.client == who and t.distortion_ms.get("pairs")]
        if not ts:
            print(f"| {who} | - | - | - | - |")
            continue
        p50 = [t.distortion_ms["p50"] for t in ts]
        p99 = [t.distortion_ms["p99"] for t in ts]
        nf = [t.noise_floor_ms for t in ts]
        print(f"| {who} | {statistics.median([t.chunks_per_s for t in ts]):,.0f} | {med_range(p50)} | {med_range(p99)} | "
              f"{statistics.median([x['p50'] for x in nf]):.4f} / {statistics.median([x['p99'] for x in nf]):.4f} |")
    print()
    bs, bv = best["studyc"], best["vllm-bench"]
    at_v = summarize([t for t in all_trials if t.mode == "burst" and t.client == "studyc"
                      and t.concurrency == bv[1]])[0]
    print(f"best studyc: {fmt_k(bs[0])} chunks/s at c={bs[1]}; best vllm bench: {fmt_k(bv[0])} chunks/s at "
          f"c={bv[1]}; studyc at c={bv[1]}: {fmt_k(at_v)} ({at_v / bv[0] if bv[0] else math.nan:.2f}x)")
    p99_default = [t.distortion_ms["p99"] for t in all_trials
                   if t.mode == "paced" and t.client == "studyc" and t.distortion_ms.get("pairs")]
    ratio = bs[0] / bv[0] if bv[0] else math.nan
    print(f"goal >= 3x chunks/s: {'met' if ratio >= 3 else 'NOT met'} ({ratio:.2f}x); goal p99 distortion "
          f"<= 0.1 ms at 15k chunks/s (studyc default, median of repeats): "
          f"{'met' if p99_default and statistics.median(p99_default) <= 0.1 else 'NOT met'}"
          f" ({statistics.median(p99_default) if p99_default else math.nan:.4f} ms); "
          f"took {time.monotonic() - t_start:.0f} s")
    if a.json:
        Path(a.json).write_text(json.dumps([asdict(t) for t in all_trials], indent=1))
    print(f"best ratio studyc/vllm-bench: {ratio:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

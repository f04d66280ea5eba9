#!/usr/bin/env bash
# Run studies on an offline GPU host with the vLLM bundle of ../shared/gpu (docs/gpu.md).
#
#   bash scripts/gpu/device.sh stamp             # HERE, before a device call: the commit into .studyc-commit
#                                                # (carry it: the copy on the device has no .git; runs.git_sha)
#   bash scripts/gpu/device.sh unpack [STUDY...] # after the bundle's pieces arrived: unpack and check
#   bash scripts/gpu/device.sh run STUDY...      # run studies/STUDY.toml, one DuckDB file each (RESUME=1: continue
#                                                # the latest run in /tmp/results/h200-STUDY.duckdb, e.g. its budget
#                                                # blocks; on a fresh machine, the one in results/h200-running/STUDY.duckdb)
#                                                # A call carries 64 MiB at most, and the bundle's largest piece
#                                                # (60 MB) leaves about 3.5 MB for the tree: a running database
#                                                # travels in a call of its own (copy it to an ignored path such as
#                                                # .vb/STUDY.duckdb, carry that, cp it to /tmp/results/h200-STUDY.duckdb),
#                                                # and results/h200-running/ stays out of the piece's call.
#                                                # FLAGS: more `studyc run` options for run, start and levers,
#                                                # e.g. FLAGS=--underpowered to run a hypothesis whose best-case
#                                                # power is under 50% (refused without it; a fresh machine's
#                                                # database has no runs, so the default priors judge it:
#                                                # docs/decidability.md). `studyc plan` says which beforehand.
#   bash scripts/gpu/device.sh start STUDY...    # the same in the background (outlives this call)
#   bash scripts/gpu/device.sh levers STUDY [THEN...] # STUDY run with --cold-starts, then held, one database;
#                                                # then `studyc phases` side by side, then THEN (background: `wait`)
#   bash scripts/gpu/device.sh wait SECONDS      # wait for it at most SECONDS, copy what it has to $OUT
#                                                # (databases gzipped in pieces: see snapshot)
#   bash scripts/gpu/device.sh calibrate         # `studyc calibrate` into /tmp/results/h200-calibrate.duckdb (a run
#                                                # with no points: this GPU's bandwidth, FLOP/s and host probe)
#   bash scripts/gpu/device.sh agree             # benchmarks/bench_agreement.py on the 8B shape
#   bash scripts/gpu/device.sh disturb           # benchmarks/telemetry_disturbance.py on the 0.6B shape
#   bash scripts/gpu/device.sh sleep [THEN...]   # benchmarks/sleep_swap.py, then THEN, in the background (`wait`)
#
# Wheels carried in .whl/ (scripts/offline_wheels.sh) are installed into /tmp/site. Results go to
# /tmp/results (kept while the machine stays warm) and are copied to $OUT when it is set.
set -u
REPO=$(cd "$(dirname "$0")/../.." && pwd)
cd "$REPO"
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT" /tmp/results /tmp/site
if [ "${1:-}" != stamp ] && ls .whl/*.whl >/dev/null 2>&1 && [ ! -d /tmp/site/duckdb ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
fi
export PYTHONPATH=$REPO:/tmp/site:/tmp/vsite PATH=/tmp/vsite/bin:$PATH PYTHONUNBUFFERED=1
export VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export STUDYC_VLLM="python3 -m vllm.entrypoints.cli.main"
# One compile cache for every call on this machine: a foreground run after a background one starts warm
export STUDYC_CACHE_DIR=${STUDYC_CACHE_DIR:-/tmp/studyc-cache}
# What the runs have so far (databases, their WALs, the logs) copied to $OUT. A file comes back only
# under 16 MiB, and a database of a long run is larger: each goes gzipped, in 15 MiB pieces
# (here: cat DIR/h200-STUDY.duckdb.gz.* | gunzip > h200-STUDY.duckdb).
snapshot() {
  rm -f "$OUT"/h200-*.duckdb.gz.* "$OUT"/h200-*.duckdb.wal
  for f in /tmp/results/h200-*.duckdb; do [ -f "$f" ] && gzip -1 -c "$f" | split -b 15M -d - "$OUT/$(basename "$f").gz."; done
  for f in /tmp/results/h200-*.duckdb.wal; do [ -f "$f" ] && cp "$f" "$OUT/"; done
  tar -C /tmp/results -czf "$OUT/logs.tgz" --exclude='*.duckdb' --exclude='*.wal' --exclude='compile-cache' . 2>/dev/null
  # How big the JIT caches grew (vLLM's compile cache, Inductor, Triton, FlashInfer): whether carrying them
  # between machines could fit the device calls' 64 MiB
  du -s "$STUDYC_CACHE_DIR" "$STUDYC_CACHE_DIR"/* "$HOME/.cache/vllm" "$HOME/.triton" /tmp/torchinductor_* \
    "$HOME/.cache/flashinfer" 2>/dev/null > "$OUT/caches.txt" || true
  # Triton's kernel cache (no secret in it, unlike vLLM's compile cache): carried back as .vb/triton-cache.tgz,
  # `unpack` puts it in place on the next machine, so its first starts can show whether the post-capture gap
  # of a fresh machine's first starts (13-15 s on 2026-12-04, 0-1 s after) is Triton compiling kernels
  [ -d "$HOME/.triton" ] && tar -C "$HOME" -czf "$OUT/triton-cache.tgz" .triton 2>/dev/null || true
  # What vLLM hashed into each compile-cache key, secrets dropped (scripts/gpu/cache_keys.py)
  python3 "$REPO/scripts/gpu/cache_keys.py" "$STUDYC_CACHE_DIR" "$OUT" 2>/dev/null || true
}
# The commit this tree is: the one `stamp` wrote where it was carried, else git
# A carried .studyc-commit wins: the device's copy of .git was seen older than the tree (2026-12-03: HEAD
# read 2ac7b81 where the tree was 60c31b1).
commit() { cat "$REPO/.studyc-commit" 2>/dev/null || git -C "$REPO" rev-parse --verify -q HEAD 2>/dev/null; }
# A background run works from its own copy of the tree (a later call's fresh copy must not change files
# under it), with the commit written in (the copy has no .git: runs.git_sha reads .studyc-commit).
copy_tree() {
  rm -rf /tmp/repo-bg && mkdir -p /tmp/repo-bg
  tar -C "$REPO" --exclude=./.vb --exclude=./.whl --exclude=./.git -cf - . | tar -C /tmp/repo-bg -xf -
  sha=$(commit) && echo "$sha" > /tmp/repo-bg/.studyc-commit
}
stage=${1:?stamp|unpack|run}; shift
case "$stage" in
  stamp)
    git -C "$REPO" rev-parse --verify HEAD > "$REPO/.studyc-commit" && echo "commit $(cat "$REPO/.studyc-commit")"
    git -C "$REPO" diff --quiet HEAD || echo "warning: the tree has changes not in that commit"
    ;;
  unpack)
    # After the bundle's last piece arrived: extract it, then check the engine, NVML and calibration.
    [ -d .vb ] && bash .vb/scripts/device_unpack.sh .vb /tmp/vsite
    # A Triton cache carried from an earlier machine (see snapshot), restored unless this one has its own
    if [ -f .vb/triton-cache.tgz ] && [ ! -d "$HOME/.triton" ]; then
      tar -C "$HOME" -xzf .vb/triton-cache.tgz && echo "triton cache restored: $(du -sh "$HOME/.triton" | cut -f1)"
    fi
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv | tee "$OUT/gpu.txt"
    python3 -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)" 2>&1 | tail -1
    python3 -c "from runner.measure.nvml import gpu_info; from runner.measure.calibrate import calibrate
print(gpu_info(0)); print(calibrate(['python3']))" 2>&1 | tail -2
    for s in "$@"; do python3 -m studyc plan "studies/$s.toml" | head -4; done
    ;;
  run)
    echo "source commit: $(commit || echo 'unknown (run device.sh stamp here and carry .studyc-commit)')"
    for s in "$@"; do
      echo "=== $s $(date +%T)"
      # A run in progress kept in the repo (results/h200-running/STUDY.duckdb) is where RESUME=1 goes on
      if [ -n "${RESUME:-}" ] && [ ! -f "/tmp/results/h200-$s.duckdb" ] && [ -f "results/h200-running/$s.duckdb" ]; then
        cp "results/h200-running/$s.duckdb" "/tmp/results/h200-$s.duckdb" && chmod u+w "/tmp/results/h200-$s.duckdb"
        echo "resuming from results/h200-running/$s.duckdb"
      fi
      # streamed, not tailed: `wait` shows the run's progress while it runs
      python3 -m studyc run "studies/$s.toml" --db "/tmp/results/h200-$s.duckdb" --keep-going ${RESUME:+--resume} ${FLAGS:-} 2>&1 | grep --line-buffered -v '━'
      snapshot
    done
    ;;
  levers)
    # A study run twice on this machine, one after the other into one database: every server started cold
    # (--cold-starts), then with held starts (the default); then `studyc phases` side by side. Background
    # like `start`, so `wait` brings the table back (issue: cheap launches, the before/after of a lever).
    # Studies named after STUDY run next, once each, in the same background job (one chain of calls).
    s=${1:?levers STUDY [THEN...]}; shift
    copy_tree
    setsid nohup bash -c "FLAGS='--cold-starts ${FLAGS:-}' bash /tmp/repo-bg/scripts/gpu/device.sh run $s; \
      bash /tmp/repo-bg/scripts/gpu/device.sh run $s; cd /tmp/repo-bg && \
      python3 -m studyc phases ${s//_/-} --db /tmp/results/h200-$s.duckdb; \
      ${*:+bash /tmp/repo-bg/scripts/gpu/device.sh run $*}" >/tmp/results/background.log 2>&1 </dev/null &
    echo $! >/tmp/results/background.pid
    echo "started $s twice (cold starts, then held) in the background, pid $(cat /tmp/results/background.pid)"
    ;;
  start)
    # The run in the background, so that a study longer than one call's limit needs no split: later
    # calls `wait` for it while the machine stays held.
    copy_tree
    setsid nohup bash /tmp/repo-bg/scripts/gpu/device.sh run "$@" >/tmp/results/background.log 2>&1 </dev/null &
    echo $! >/tmp/results/background.pid
    echo "started $* in the background, pid $(cat /tmp/results/background.pid)"
    # What the run has so far into this call's $OUT every minute while the run lasts: a call that goes on
    # after `start` (a sleep, then `wait`) and is cut short by its limit or the session's device time still
    # brings back what was committed
    ( while kill -0 "$(cat /tmp/results/background.pid)" 2>/dev/null; do sleep 60; snapshot; done ) \
      >/dev/null 2>&1 </dev/null &
    ;;
  wait)
    # Copies what the run has to $OUT every minute as well as at the end: a call cut short (its time
    # limit, or the session's device time running out) still brings back what was committed by then.
    limit=${1:-560}; t0=$(date +%s); last=0
    # No background run on this machine (a fresh one: the last was released): say so, do not wait
    # (`kill -0 0` would succeed: it signals our own process group).
    pid=$(cat /tmp/results/background.pid 2>/dev/null) || { echo "no background run on this machine"; exit 3; }
    while kill -0 "$pid" 2>/dev/null && [ $(( $(date +%s) - t0 )) -lt "$limit" ]; do
      sleep 5
      if [ $(( $(date +%s) - last )) -ge 60 ]; then snapshot; last=$(date +%s); fi
    done
    kill -0 "$pid" 2>/dev/null && echo "still running after ${limit} s" || echo "background run finished"
    tail -80 /tmp/results/background.log
    snapshot
    ;;
  calibrate)
    echo "source commit: $(commit || echo unknown)"
    t0=$(date +%s%N)
    python3 -m studyc calibrate --db /tmp/results/h200-calibrate.duckdb 2>&1 | tail -5
    echo "calibrate took $(( ($(date +%s%N) - t0) / 1000000 )) ms"
    snapshot
    ;;
  agree)
    # studyc's client vs `vllm bench serve --temperature 0` on one Qwen3-8B server (issue: gates, item 8)
    python3 benchmarks/bench_agreement.py --model-dir models/qwen3-8b --engine "$STUDYC_VLLM" \
      --engine-arg=--max-model-len=4096 --levels 1,32 --requests 8,96 --input-len 128 --output-len 256 \
      --blocks "${BLOCKS:-3}" --json "$OUT/agreement.json" --log /tmp/results/agreement-server.log 2>&1 | grep -v '━' | tail -40
    ;;
  sleep)
    # a woken server vs fresh starts, two KV arms swapped by sleep mode (issue: cheap launches); background
    # like `start`, so `wait` brings the table back
    # Studies named after it run next in the same background job (sleep [THEN...]).
    copy_tree
    setsid nohup bash -c "cd /tmp/repo-bg && python3 benchmarks/sleep_swap.py --engine '$STUDYC_VLLM' \
      --model models/qwen3-8b --arm 'bf16=--kv-cache-dtype auto' --arm 'fp8=--kv-cache-dtype fp8' \
      --launches ${LAUNCHES:-2} --cycles ${CYCLES:-3} --json /tmp/results/sleep_swap.json --logs /tmp/results/sleep-logs; \
      ${*:+bash /tmp/repo-bg/scripts/gpu/device.sh run $*}" \
      >/tmp/results/background.log 2>&1 </dev/null &
    echo $! >/tmp/results/background.pid
    echo "sleep_swap started, pid $(cat /tmp/results/background.pid)"
    ;;
  disturb)
    # token gaps of measured vs unmeasured requests, with and without the /metrics poller and NVML
    python3 benchmarks/telemetry_disturbance.py --engine "$STUDYC_VLLM" --model models/qwen3-0.6b \
      --serve-args "--load-format dummy --max-model-len 4096" --input-len 128 --output-len 256 \
      --concurrency 1 --requests 4 --blocks "${BLOCKS:-4}" --gpu-index 0 --client-cpus none \
      --json "$OUT/disturbance.json" 2>&1 | grep -v '━' | tail -40
    ;;
esac

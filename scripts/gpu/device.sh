#!/usr/bin/env bash
# Run studies on an offline GPU host with the vLLM bundle of ../shared/gpu (see README, "On a GPU").
#
#   bash scripts/gpu/device.sh unpack            # after the bundle's pieces arrived: unpack, check, warm
#   bash scripts/gpu/device.sh run STUDY...      # run studies/STUDY.toml, one DuckDB file each
#
# Wheels carried in .whl/ (scripts/offline_wheels.sh) are installed into /tmp/site. Results go to
# /tmp/results (kept while the machine stays warm) and are copied to $OUT when it is set.
set -u
REPO=$(cd "$(dirname "$0")/../.." && pwd)
cd "$REPO"
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT" /tmp/results /tmp/site
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
fi
export PYTHONPATH=$REPO:/tmp/site:/tmp/vsite PATH=/tmp/vsite/bin:$PATH PYTHONUNBUFFERED=1
export VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export STUDYC_VLLM="python3 -m vllm.entrypoints.cli.main"
stage=${1:?unpack|run}; shift
case "$stage" in
  unpack)
    [ -d .vb ] && bash .vb/scripts/device_unpack.sh .vb /tmp/vsite
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv | tee "$OUT/gpu.txt"
    python3 -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)" 2>&1 | tail -1
    for s in "$@"; do python3 -m studyc plan "studies/$s.toml" | head -4; done
    # Warm torch.compile's cache (kept under ~/.cache while the machine is held): later starts are faster.
    python3 - <<'PY'
import time
from pathlib import Path
from compiler.load import load_study
from compiler.plan import compile_study
from runner.engine import VllmServer
from runner.tokenizer import ensure_tokenizer
plan = compile_study(load_study("studies/decode_roofline.toml"))
for step in plan.servers:
    ensure_tokenizer(step.model_dir)
    t0 = time.monotonic()
    with VllmServer(step.argv, env=step.env, log_path=Path(f"/tmp/results/warm-{step.arm}.log")) as server:
        info = server.info
        print(f"warm start {step.arm}: {info.startup_s:.1f} s, KV {info.kv_capacity_tokens} tokens, vllm {info.vllm_version}")
PY
    ;;
  run)
    for s in "$@"; do
      echo "=== $s $(date +%T)"
      python3 -m studyc run "studies/$s.toml" --db "/tmp/results/h200-$s.duckdb" --keep-going 2>&1 | grep -v '━' | tail -60
      cp "/tmp/results/h200-$s.duckdb" "$OUT/" 2>/dev/null
    done
    tar -C /tmp/results -czf "$OUT/logs.tgz" --exclude='*.duckdb' . 2>/dev/null
    ;;
esac

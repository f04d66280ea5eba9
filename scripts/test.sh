#!/usr/bin/env bash
# Install everything the tests need (studyc, vLLM CPU, Chromium) and run them.
#   bash scripts/test.sh            lint, types and every test (CI runs this)
#   bash scripts/test.sh --fast     lint, types and every test that starts no server and no browser, in two
#                                   pytest-xdist workers (`-n 0` after --fast: one process)
#   bash scripts/test.sh ARGS...    extra arguments go to pytest
set -euo pipefail
cd "$(dirname "$0")/.."
fast=()
if [ "${1:-}" = "--fast" ]; then
  shift
  # Two workers: the tests are CPU-bound and xdist-safe. The full tier stays in one process: its session's
  # vLLM server would start once per worker, and its servers' timing checks want the cores to themselves.
  fast=(-m "not vllm and not chromium and not ray" -n 2)
  bash scripts/setup.sh --no-vllm  # no server, no browser
else
  bash scripts/setup.sh --with-chromium
fi
export STUDYC_VLLM="${STUDYC_VLLM:-$PWD/.venv-vllm/bin/vllm}"
.venv/bin/ruff check base compiler runner report studyc tests benchmarks scripts
.venv/bin/mypy base compiler runner studyc report
.venv/bin/pytest -q "${fast[@]}" "$@"

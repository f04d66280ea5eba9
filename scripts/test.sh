#!/usr/bin/env bash
# Install everything the tests need (studyc, vLLM CPU, Chromium) and run them.
#   bash scripts/test.sh            lint, types and every test (CI runs this)
#   bash scripts/test.sh --fast     lint, types and every test that starts no server and no browser
#   bash scripts/test.sh ARGS...    extra arguments go to pytest
set -euo pipefail
cd "$(dirname "$0")/.."
fast=()
if [ "${1:-}" = "--fast" ]; then
  shift
  fast=(-m "not vllm and not chromium")
  bash scripts/setup.sh            # no browser needed
else
  bash scripts/setup.sh --with-chromium
fi
export STUDYC_VLLM="${STUDYC_VLLM:-$PWD/.venv-vllm/bin/vllm}"
.venv/bin/ruff check base compiler runner report studyc tests benchmarks scripts
.venv/bin/mypy base compiler runner studyc report
.venv/bin/pytest -q "${fast[@]}" "$@"

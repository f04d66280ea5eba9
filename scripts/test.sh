#!/usr/bin/env bash
# Install everything the tests need (studyc, vLLM CPU, Chromium) and run them.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --with-chromium
export STUDYC_VLLM="${STUDYC_VLLM:-$PWD/.venv-vllm/bin/vllm}"
.venv/bin/ruff check compiler runner report studyc tests benchmarks scripts
.venv/bin/mypy compiler runner studyc report
.venv/bin/pytest -q "$@"

#!/usr/bin/env bash
# Install everything the tests need (studyc, vLLM CPU, Chromium) and run them.
#   bash scripts/test.sh            lint, types and every test (CI runs this): the fast tier in two
#                                   pytest-xdist workers, then the server, browser and cluster tests in one process
#   bash scripts/test.sh --fast     lint, types and every test that starts no server and no browser, in two
#                                   pytest-xdist workers (`-n 0` after --fast: one process)
#   bash scripts/test.sh ARGS...    extra arguments go to pytest
set -euo pipefail
cd "$(dirname "$0")/.."
fast=()
if [ "${1:-}" = "--fast" ]; then
  shift
  # Two workers: the tests are CPU-bound and xdist-safe.
  fast=(-m "not vllm and not chromium and not ray" -n 2)
  bash scripts/setup.sh --no-vllm  # no server, no browser
else
  bash scripts/setup.sh --with-chromium
fi
export STUDYC_VLLM="${STUDYC_VLLM:-$PWD/.venv-vllm/bin/vllm}"
.venv/bin/ruff check base compiler runner report studyc tests benchmarks scripts
.venv/bin/mypy base compiler runner studyc report
if [ ${#fast[@]} -gt 0 ]; then
  .venv/bin/pytest -q "${fast[@]}" "$@"
  exit
fi
# Every test: those that start nothing in two workers (as --fast), then the ones that start a vLLM server, a
# browser or a Ray cluster in one process (the session's server starts once; its timing checks want the
# cores). Exit status 5 (nothing selected, e.g. with -k) is not a failure of either half.
status=0
.venv/bin/pytest -q -m "not vllm and not chromium and not ray" -n 2 "$@" || status=$?
if [ "$status" -ne 0 ] && [ "$status" -ne 5 ]; then exit "$status"; fi
status=0
.venv/bin/pytest -q -m "vllm or chromium or ray" "$@" || status=$?
if [ "$status" -ne 0 ] && [ "$status" -ne 5 ]; then exit "$status"; fi

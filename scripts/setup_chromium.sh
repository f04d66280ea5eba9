#!/usr/bin/env bash
# Install headless Chromium (Debian's `chromium` package) for the site tests. Idempotent.
# Usage: scripts/setup_chromium.sh   (needs root or sudo; apt only, no browser download of its own)
set -euo pipefail
if command -v chromium >/dev/null 2>&1; then
  echo "chromium already installed: $(chromium --version 2>/dev/null || true)"; exit 0
fi
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >/dev/null
chromium --version

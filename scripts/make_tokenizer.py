#!/usr/bin/env python3
"""Build the local tokenizer of model folders: `python scripts/make_tokenizer.py models/qwen3-8b ...`."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from runner.server.tokenizer import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

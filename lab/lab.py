#!/usr/bin/env python3
"""The storm lab's entry point (the orchestrator is the `retrylab` package beside this file):

    lab.py run SCENARIO.toml [--modes none,observe,shim] [--retries N] [--rate X] [--out DIR]
    lab.py analyse SCENARIO.toml OUT_DIR
    lab.py cleanup
    lab.py leftovers
"""
import sys
from pathlib import Path

# Importable however this file is started (from the repo root, from lab/, by absolute path).
sys.path.insert(0, str(Path(__file__).resolve().parent))

from retrylab.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())

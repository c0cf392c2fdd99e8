#!/usr/bin/env python3
"""Kept for existing users: `from diffcheck_dump import RankDump` goes on
working. The code lives in the `diffcheck` Python package (python/diffcheck/
dump.py), installed by scripts/setup.sh; from a source tree that was not set
up, it is found beside this script."""
import os
import sys

try:
    from diffcheck.dump import SCHEMA_VERSION, RankDump, ReferenceDump, to_numpy  # noqa: F401
except ImportError:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
    from diffcheck.dump import SCHEMA_VERSION, RankDump, ReferenceDump, to_numpy  # noqa: F401

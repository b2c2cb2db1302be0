"""Oracle tests: slow, need llama-cpp-python (scripts/test-oracles.sh installs it). They reuse
the main suite's helpers (tests/python) and the source tree's `tinyloop` package."""
import os
import sys

_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
for p in (os.path.join(_ROOT, "python"), os.path.join(_ROOT, "tests", "python")):
    if p not in sys.path:
        sys.path.insert(0, p)

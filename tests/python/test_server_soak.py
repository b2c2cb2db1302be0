"""The short version of bench/server_soak.py (5,000 requests there): 300 requests through
`tinyloop serve` with a third of the streams dropped by the client mid-way; afterwards
nothing runs, the KV blocks in use are exactly the prefix cache's, and RSS stays flat."""
import os
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "bench"))

import server_soak  # noqa: E402


def test_soak_leaves_kv_and_rss_at_idle_level(capsys):
    rc = server_soak.main(["--requests", "300", "--clients", "8", "--time-limit", "300"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "dropped by the client" in out and " 0 dropped" not in out

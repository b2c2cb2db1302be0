"""bench/batched_decode.py's pure helpers: the steady-decode window it cuts from the token
arrival timeline, and the table it derives from the per-round step times. No engine runs."""
import argparse
import math
import os
import sys

import pytest

_REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(_REPO, "bench"))

import batched_decode as bd  # noqa: E402


def test_window_spans_the_steps_between_two_counts():
    # The fewest tokens any request holds, as it rose: 1 after the prefill, then one a step.
    arrivals = [(0.50, 1), (0.60, 2), (0.62, 3), (0.64, 4), (0.66, 5)]
    dt, steps = bd.step_window(arrivals, 2, 5)
    assert steps == 3
    assert math.isclose(dt, 0.06)


def test_window_takes_the_first_time_a_count_is_reached_or_passed():
    # A wake-up may see two steps at once: the count jumps from 2 to 4.
    arrivals = [(1.0, 2), (1.3, 4), (1.4, 5)]
    dt, steps = bd.step_window(arrivals, 3, 5)
    assert steps == 2
    assert math.isclose(dt, 0.1)


def test_window_is_none_when_the_timeline_stops_short():
    assert bd.step_window([(0.0, 1), (0.1, 2)], 2, 4) is None
    assert bd.step_window([], 1, 2) is None


def test_table_rows_medians_and_ratios():
    # B = 1: 10 ms a step (100 tok/s); B = 4: 20 ms (200 tok/s, half as cheap a row).
    rows = bd.table_rows({4: [20.0, 30.0, 19.0], 1: [10.0, 11.0, 9.0]}, weight_bytes=300e6)
    assert [r["B"] for r in rows] == [1, 4]
    one, four = rows
    assert math.isclose(one["ms_step"], 10.0) and math.isclose(one["tok_s"], 100.0)
    assert math.isclose(one["per_row"], 1.0) and math.isclose(one["speedup"], 1.0)
    assert math.isclose(four["ms_step"], 20.0) and math.isclose(four["tok_s"], 200.0)
    assert math.isclose(four["per_row"], 0.5) and math.isclose(four["speedup"], 2.0)
    # One pass over 300 MB of weights a step: 30 GB/s at 10 ms, 15 at 20 ms.
    assert math.isclose(one["weight_gb_s"], 30.0) and math.isclose(four["weight_gb_s"], 15.0)
    assert four["spread"] == (19.0, 30.0)


def test_table_rows_without_b1_has_no_ratios():
    (row,) = bd.table_rows({8: [40.0]}, weight_bytes=1e9)
    assert row["per_row"] is None and row["speedup"] is None
    assert "| 8 | 200.0 | 40.00 (40.00-40.00) | - | - | 25.0 |" in bd.format_rows([row])


def test_format_rows_is_a_markdown_table():
    lines = bd.format_rows(bd.table_rows({1: [10.0], 2: [12.5]}, weight_bytes=1e8))
    assert lines[0].startswith("| B | tokens/s |") and lines[1].startswith("|---:")
    assert lines[3] == "| 2 | 160.0 | 12.50 (12.50-12.50) | 0.80 | 1.60 | 8.0 |"


def test_ints_rejects_empty_and_non_positive():
    assert bd.ints("1,2, 64") == [1, 2, 64]
    for bad in ("", "0", "1,-2"):
        with pytest.raises(argparse.ArgumentTypeError):
            bd.ints(bad)

"""bench/step_latency.py: its pure helpers (step gaps, the summary row) and one short run
on a tiny random model through its command line."""
import os
import sys

import pytest

_REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(_REPO, "bench"))

import step_latency as sl  # noqa: E402


def test_gaps_are_milliseconds_between_arrivals():
    assert sl.step_gaps([1.0, 1.010, 1.030]) == pytest.approx([10.0, 20.0])
    assert sl.step_gaps([2.0]) == []


def test_summary_first_step_apart_from_the_rest():
    # Two runs: first steps 30 and 32 ms; later steps 10, 11, 12, 40 (one stall).
    s = sl.summarize([[30.0, 10.0, 11.0], [32.0, 12.0, 40.0]])
    assert s["first"] == pytest.approx(31.0)
    assert s["median"] == pytest.approx(11.5)
    assert s["max"] == pytest.approx(40.0)
    assert s["max_over_median"] == pytest.approx(40.0 / 11.5)


def test_summary_needs_two_later_steps():
    with pytest.raises(ValueError, match="two decode steps"):
        sl.summarize([[5.0]])


def test_short_run_prints_one_row_per_prompt(tmp_path, capsys):
    from tinyloop.random_model import write_random_model
    path = write_random_model(str(tmp_path / "tiny.tinyloop"), "llama", seed=3, dim=64, n_heads=4, n_kv_heads=2,
                              ffn_dim=128, vocab_size=300, n_pre_blocks=1, n_loop_layers=1, n_post_blocks=1,
                              default_loops=2, max_seq_len=128)
    assert sl.main(["--model", path, "-L", "2", "-p", "5,33", "-n", "4", "-r", "1"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert [r.split("|")[1].strip() for r in rows] == ["5", "33"]
    for r in rows:
        first, median, worst, ratio = (float(x) for x in r.split("|")[2:6])
        assert 0 < median <= worst and ratio >= 1.0 and first > 0


def test_bad_arguments_are_refused():
    with pytest.raises(SystemExit):
        sl.main(["-n", "2"])
